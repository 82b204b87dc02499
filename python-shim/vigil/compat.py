"""Drop-in for NVRx's ``nvidia_resiliency_ext.fault_tolerance.RankMonitorClient``, backed by vigil.

Replace ``from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient`` with
``from vigil.compat import RankMonitorClient``. Differences that matter:

* Timeouts are calculated by the vigil agent from what it observes on every rank, not by the
  client. ``calculate_and_set_*`` only refresh ``hb_timeouts`` / ``section_timeouts`` from the
  timeouts the agent reports and say whether the agent has any in force; they never raise.
* ``state_dict()`` holds the latest timeouts received from the agent (in seconds, in NVRx's
  layout, so NVRx can load it too). ``load_state_dict()`` keeps what it is given for
  ``state_dict()`` until the agent reports its own values; the agent persists its calculated
  timeouts itself, so nothing is sent to it.
* Heartbeats and sections are fire-and-forget (about a microsecond, no reply); a missing agent
  makes them no-ops with one warning instead of ``RankMonitorClientError``.
"""

import dataclasses
import logging
from typing import Any, Collection, Dict, List, Mapping, Optional

import vigil


class RankMonitorClientError(Exception):
    pass


@dataclasses.dataclass
class HeartbeatTimeouts:
    """Heartbeat timeouts in seconds; None means that check is off.

    ``were_calculated`` is None: whether the agent calculated or was configured with them is not
    reported over the wire.
    """

    initial: Optional[float] = None
    subsequent: Optional[float] = None
    were_calculated: Optional[bool] = None

    @property
    def are_valid(self) -> bool:
        return self.initial is not None and self.subsequent is not None


@dataclasses.dataclass
class SectionTimeouts:
    """Section timeouts in seconds, NVRx's layout."""

    section: Dict[str, float] = dataclasses.field(default_factory=dict)
    out_of_section: Optional[float] = None
    calculated_sections: List[str] = dataclasses.field(default_factory=list)
    is_out_of_section_calculated: bool = False


def _seconds(ms):
    return None if ms is None else ms / 1000.0


class RankMonitorClient:
    """NVRx's client API mapped onto the vigil module API (see the module docstring)."""

    CURRENT_TIMEOUTS_STATE_KEY = "current_timeouts"

    def __init__(self):
        self.is_initialized = False
        self.hb_timeouts = HeartbeatTimeouts()
        self.section_timeouts = SectionTimeouts()
        self.loaded_state = None
        self._from_agent = False
        self.logger = logging.getLogger(__name__)

    def _ensure_is_ready(self):
        if not self.is_initialized:
            raise RankMonitorClientError("RankMonitorClient is not initialized")

    def _refresh(self):
        t = vigil.timeouts()
        if t is None:
            return
        self._from_agent = True
        self.hb_timeouts = HeartbeatTimeouts(
            initial=_seconds(t["initial_ms"]), subsequent=_seconds(t["heartbeat_ms"])
        )
        self.section_timeouts = SectionTimeouts(
            section={name: ms / 1000.0 for name, ms in t["sections"].items()},
            out_of_section=_seconds(t["out_of_section_ms"]),
        )

    def init_workload_monitoring(self, *args, **kwargs) -> None:
        """Connects to the vigil agent and registers this rank.

        Arguments of any NVRx release (``get_state_dict_cb``, ``chkpt_manager``,
        ``num_warmup_iters``, ...) are accepted and ignored: the agent owns that configuration.
        """
        if self.is_initialized:
            raise RankMonitorClientError("RankMonitorClient is already initialized")
        vigil.is_connected()
        self._refresh()
        self.is_initialized = True

    def shutdown_workload_monitoring(self) -> None:
        """Closes the connection; the agent stops watching this rank until the next init."""
        if self.is_initialized:
            vigil.close()
            self.is_initialized = False

    def send_heartbeat(self, state: Optional[Mapping[str, Any]] = None) -> None:
        """Sends a heartbeat. ``state`` (old NVRx releases) is not transmitted."""
        self._ensure_is_ready()
        vigil.heartbeat()

    def start_section(self, section: str) -> None:
        self._ensure_is_ready()
        vigil.start_section(section)

    def end_section(self, section: str) -> None:
        self._ensure_is_ready()
        vigil.end_section(section)

    def end_all_sections(self) -> None:
        self._ensure_is_ready()
        vigil.end_all_sections()

    def calculate_and_set_hb_timeouts(self, skip_if_not_ready: bool = False) -> bool:
        """Refreshes ``hb_timeouts`` from the agent, which calculates timeouts itself.

        Returns True when the agent reports both heartbeat timeouts in force, False otherwise
        (whatever ``skip_if_not_ready`` says).
        """
        self._ensure_is_ready()
        self._refresh()
        return self._from_agent and self.hb_timeouts.are_valid

    def calculate_and_set_section_timeouts(
        self,
        selected_sections: Optional[Collection[str]] = None,
        calc_out_of_section: bool = True,
        skip_if_not_ready: bool = False,
    ) -> bool:
        """Refreshes ``section_timeouts`` from the agent, which calculates timeouts itself.

        Returns True when the agent reports a timeout for every selected section (any section
        when None) and, with ``calc_out_of_section``, an out-of-section timeout; False otherwise.
        """
        self._ensure_is_ready()
        self._refresh()
        if not self._from_agent:
            return False
        have = self.section_timeouts.section
        if selected_sections is None:
            ok = bool(have)
        else:
            ok = all(name in have for name in selected_sections)
        if calc_out_of_section and self.section_timeouts.out_of_section is None:
            ok = False
        return ok

    def calculate_and_set_timeouts(self, skip_if_not_ready: bool = False) -> bool:
        """Name of ``calculate_and_set_hb_timeouts`` in NVRx releases before sections existed."""
        return self.calculate_and_set_hb_timeouts(skip_if_not_ready)

    def state_dict(self) -> Mapping[str, Any]:
        """The latest timeouts received from the agent (seconds, NVRx layout)."""
        if self.is_initialized:
            self._refresh()
        if not self._from_agent and self.loaded_state is not None:
            return dict(self.loaded_state)
        current = {}
        if self._from_agent:
            current["heartbeat"] = dataclasses.asdict(self.hb_timeouts)
            current["section"] = dataclasses.asdict(self.section_timeouts)
        return {self.CURRENT_TIMEOUTS_STATE_KEY: current}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Keeps ``state`` for ``state_dict()`` until the agent reports timeouts; sends nothing."""
        if self.CURRENT_TIMEOUTS_STATE_KEY in state:
            self.loaded_state = {self.CURRENT_TIMEOUTS_STATE_KEY: dict(state[self.CURRENT_TIMEOUTS_STATE_KEY])}
