"""The table machinery: design, runs, tuning, claims, power, reports. Imports no table."""
