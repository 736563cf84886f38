"""symcomm's exceptions: one class per kind of failure, all under :class:`Error`.

They mirror the Rust library's ``symcomm::Error`` variants. Messages never contain the
communicator's secret.
"""


class Error(Exception):
    """Any symcomm failure."""


class InvalidArgument(Error, ValueError):
    """Bad input, refused before anything ran; the communicator stays usable."""


class Timeout(Error, TimeoutError):
    """A wait (on the device or on the host) reached its deadline."""


class Aborted(Error):
    """The communicator was aborted, by this rank or a peer."""


class PeerLost(Error):
    """A peer rank is gone: its process died or stopped answering."""


class Mismatch(Error):
    """Ranks made different calls (collective, count, type, root, ...)."""


class PeerFailed(Error):
    """A peer failed the same call, for its own reason."""


class Unsupported(Error):
    """Not supported in this configuration (e.g. windows across hosts)."""


class NoDriver(Error):
    """No CUDA driver (or no NVRTC) on this machine."""


class CudaError(Error):
    """A CUDA call failed."""


class BootstrapError(Error):
    """Joining the communicator failed (rendezvous, authentication, versions)."""


__all__ = [
    "Error",
    "InvalidArgument",
    "Timeout",
    "Aborted",
    "PeerLost",
    "Mismatch",
    "PeerFailed",
    "Unsupported",
    "NoDriver",
    "CudaError",
    "BootstrapError",
]
