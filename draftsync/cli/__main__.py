"""`python -m draftsync.cli`: the `draftsync` command without the installed console script."""

from draftsync.cli.app import main

main()
