"""The node process: its lifecycle (recover, ready, serve, stop), background jobs, metrics
and systemd readiness."""
