"""Deprecated keyword spellings of public functions, mapped with a ``FutureWarning``.

``margin`` named the non-inferiority margin δ before it became ``ni_margin`` (``margin``
is also a verification rule); the public statistics, selection and report functions
still accept ``margin=`` through :func:`renamed_kwargs`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: Why each old keyword was renamed, appended to the deprecation message.
_WHY = {
    "margin": "the non-inferiority margin δ; `margin` is a verification rule",
}


def renamed_kwargs(**renames: str) -> Callable[[F], F]:
    """Let a function accept old keyword names: ``@renamed_kwargs(margin="ni_margin")``.

    A call with the old keyword is passed on under the new one, with a ``FutureWarning``
    (shown by default: notebooks and scripts are written by users) pointing at the caller.
    Giving both the old and the new keyword raises ``TypeError``.
    """

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(
                            f"{func.__name__}() got both {old}= and {new}= "
                            f"({old}= is the deprecated name of {new}=)"
                        )
                    why = f" ({_WHY[old]})" if old in _WHY else ""
                    warnings.warn(
                        f"{old}= is deprecated, use {new}={why}",
                        FutureWarning,
                        stacklevel=2,
                    )
                    kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
