"""Every exception the runtime raises on purpose, in one place."""

from __future__ import annotations

from thinkray.storage.errors import ThinkrayError, UserError

__all__ = ["RemoteCallError", "ThinkrayError", "UserError"]


class RemoteCallError(UserError, AttributeError):
    """A call through an agent handle that the agent does not allow: the method is not
    remote-callable, or the arguments do not fit its signature. Nothing ran.

    ``method`` is the name called; ``allowed`` the remote-callable names."""

    def __init__(self, message: str, method: str = "", allowed: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.method = method
        self.allowed = tuple(allowed)

    def __reduce__(self) -> tuple[type, tuple[str, str, tuple[str, ...]]]:
        return type(self), (str(self), self.method, self.allowed)

    def __str__(self) -> str:  # AttributeError would repr a non-str argument
        return str(self.args[0]) if self.args else ""
