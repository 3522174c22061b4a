"""HTTP API under /api/v1: one router per resource in service/api/routes/."""
