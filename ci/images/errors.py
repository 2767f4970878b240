"""The errors ``ci.images`` raises. Each class has the exit code the CLI returns for it."""

from __future__ import annotations


class ImagesError(Exception):
    """Base of every error raised on purpose; ``exit_code`` is what the CLI exits with."""

    exit_code = 1
    trace: tuple[object, ...] = ()  # lookup steps taken before the error, when there were any


class DockerfileError(ImagesError, ValueError):
    """The Dockerfile cannot be parsed, or uses something the key cannot cover."""


class InputError(ImagesError, ValueError):
    """A build input is missing, outside the context, unpinned, or not declared."""


class RegistryError(ImagesError):
    """The registry did not answer usably (HTTP 5xx, timeout, refused, malformed reply).

    Never a reason to rebuild or promote: the caller stops and says so.
    """

    exit_code = 3


class IdentityMismatch(ImagesError):
    """A content tag points at an image whose labels describe other content: a hard failure."""

    exit_code = 4


class PromotionRefused(ImagesError):
    """A promotion was asked for that the policy, or the image's state, does not allow."""

    exit_code = 5


class StableConflict(ImagesError):
    """The stable alias moved under us (compare-and-swap lost); nothing more was written."""

    exit_code = 6
