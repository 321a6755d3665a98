"""`python -m draftsync.cli`: the `draftsync` command without the installed console script."""

from draftsync.cli.app import main

# Guarded: a process that multiprocessing spawns (the demo's background target build) imports this module again.
if __name__ == "__main__":
    main()
