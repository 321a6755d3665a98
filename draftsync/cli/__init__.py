"""The `draftsync` command line: the typer app, its command groups, and the commands that are no flow (status, demo)."""
