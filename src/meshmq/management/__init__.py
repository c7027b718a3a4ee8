"""Statistics snapshots and admin operations, served over a small HTTP endpoint."""
