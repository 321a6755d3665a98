"""One error type that always says what is wrong and how to fix it."""


class DraftsyncError(Exception):
    """A user-facing failure: `what` names the thing at fault, `fix` says what to do about it."""

    def __init__(self, what: str, fix: str):
        self.what = what
        self.fix = fix
        super().__init__(f"{what}\n  fix: {fix}")

    def __reduce__(self):
        """Pickled whole (Prefect keeps a failed run's exception): the default passes one argument, not two."""
        return (type(self), (self.what, self.fix))
