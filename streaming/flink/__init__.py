"""PyFlink window job (SQL in sql/, runner in job.py)."""
