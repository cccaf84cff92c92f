"""HTTP plumbing every API shares: middlewares (body limits, CORS, API keys), SSE streams."""
