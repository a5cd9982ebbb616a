"""Results out to where a team already tracks its runs: MLflow (mlflow_export.py)."""
