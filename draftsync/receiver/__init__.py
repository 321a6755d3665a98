"""The MLflow webhook receiver: an HTTP entry point that turns signed registry deliveries into sync requests."""
