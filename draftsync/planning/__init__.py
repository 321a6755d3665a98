"""Planning a sync before it starts: what each stage needs of the worker, and the settings that make it fit."""
