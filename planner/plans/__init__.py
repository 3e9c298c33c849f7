"""Torch-free integer plans shared by the budget and the runtime operators (DESIGN §9):
chunking, routing-profile route counts, LLEP assignment, ring schedule, SCO selection and the
flat-slice bucket partition. The planner and the operators compute the very same integers here.
"""
