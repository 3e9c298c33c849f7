"""Rendering of reports: rich tables for people, JSON for scripts, CSV and plots for sweeps."""
