"""A client of a simulated fleet: which phone it pretends to be, and how long its round would take
there. Both apps use it: the client reports the figures as metrics, the server reads them back to
decide who finished first (``server.stragglers``).

Flower metrics hold numbers only, so the profile travels as an index into
:data:`FLEET_PROFILES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mgfl.cost_model import predict_step, uplink_seconds
from mgfl.device_profiles import H200, PROFILES, DeviceProfile
from mgfl.fleet import profile_for, uplink_bits_per_second

FLEET_PROFILES = (*PROFILES, H200.name)  # index order of the "device-profile" metric
TRAIN_KEY = "sim-train-s"
UPLINK_KEY = "sim-uplink-s"
PROFILE_KEY = "device-profile"


def check_devices(devices: str) -> None:
    """Refuses a ``devices`` setting that is neither ``mix`` nor a known profile, naming them."""
    if devices.strip().lower() == "mix":
        return
    try:
        profile_for(devices, 0)
    except ValueError:
        raise ValueError(
            f"devices = {devices!r}: choose mix or one of {', '.join(FLEET_PROFILES)}"
        ) from None


def profile_index(name: str) -> int:
    return FLEET_PROFILES.index(name)


def profile_name(index: int) -> str:
    """The profile a ``device-profile`` metric names; a value outside the table is refused."""
    if index != int(index) or not 0 <= int(index) < len(FLEET_PROFILES):
        raise ValueError(f"device-profile {index} is not an index of the profile table")
    return FLEET_PROFILES[int(index)]


@dataclass(frozen=True)
class SimulatedPhone:
    """The phone one client stands for: its GPU profile and its uplink."""

    client: int
    profile: DeviceProfile
    uplink_bits_per_second: float

    @classmethod
    def of(cls, devices: str, client: int, median_mbps: float, seed: int) -> SimulatedPhone:
        """Client ``client``'s phone: drawn from the mix or the named profile, with a seeded
        lognormal uplink around ``median_mbps``."""
        return cls(client, profile_for(devices, client, seed),
                   uplink_bits_per_second(client, median_mbps, seed))

    def train_seconds(self, step, steps: int) -> float:
        """``steps`` optimizer steps of a compiled step, as the cost model predicts them here."""
        return steps * predict_step(step, self.profile).total_s

    def uplink_seconds(self, nbytes: int) -> float:
        return uplink_seconds(nbytes, self.uplink_bits_per_second)

    def metrics(self, step, steps: int, uplink_bytes: int) -> dict[str, float | int]:
        """What the client reports of its simulated round."""
        return {
            TRAIN_KEY: float(self.train_seconds(step, steps)),
            UPLINK_KEY: float(self.uplink_seconds(uplink_bytes)),
            PROFILE_KEY: profile_index(self.profile.name),
        }
