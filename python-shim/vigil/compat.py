"""Drop-in for NVRx's ``nvidia_resiliency_ext.fault_tolerance`` client API, backed by vigil.

Replace ``import nvidia_resiliency_ext.fault_tolerance as ft`` with ``import vigil.compat as ft``
(or ``from vigil.compat import RankMonitorClient``). Behaviour follows NVRx 0.7:

* Configured timeouts stay in force until the code calls ``calculate_and_set_hb_timeouts()`` or
  ``calculate_and_set_section_timeouts()``; ``init_workload_monitoring()`` tells the agent so, and
  the agent then never recalculates on its own. A timeout that is not configured (``null``) is
  off until calculated.
* ``calculate_and_set_*`` is a collective, as in NVRx: every rank calls it, the agent calculates
  from what it observed on every rank of the job (no ``torch.distributed`` needed) and answers;
  the call returns True once the values are in force (``hb_timeouts.are_valid`` turns True). Not
  enough observed: False with ``skip_if_not_ready=True``, else ``RankMonitorClientError``.
* ``state_dict()`` holds the calculated timeouts (seconds, NVRx's layout, so NVRx can load it
  too). ``load_state_dict()`` keeps what it is given for ``state_dict()`` until the agent reports
  calculated values; the agent keeps its calculated timeouts itself (``--timeouts-file``).
* Heartbeats and sections are fire-and-forget (about a microsecond, no reply); a missing agent
  makes every call a no-op with one warning instead of ``RankMonitorClientError``.
* A calculation that set values logs ``Updated heartbeat timeouts: ...`` / ``Updated section
  timeouts: ...`` at INFO on the ``vigil.compat`` logger (NVRx's rank monitor logs the same).
* ``send_workload_control_request()``: see its docstring for what each action does under vigil.
"""

import dataclasses
import enum
import logging
from typing import Any, Collection, Dict, Mapping, Optional, Set

import vigil


class RankMonitorClientError(Exception):
    pass


class WorkloadAction(enum.Enum):
    """NVRx's actions a rank may request from the launcher."""

    Continue = 0
    ExcludeThisNode = 1
    ShutdownWorkload = 2


class WorkloadControlRequest:
    """NVRx's request for an action from the launcher, with a description for the logs."""

    def __init__(self, action: WorkloadAction, description="<not set>"):
        self.action = action
        self.description = description

    def __str__(self):
        return "WorkloadControlRequest(action=%s, description=%s)" % (self.action, self.description)


@dataclasses.dataclass
class HeartbeatTimeouts:
    """Heartbeat timeouts in seconds; None means that check is off (infinite)."""

    initial: Optional[float] = None
    subsequent: Optional[float] = None
    were_calculated: Optional[bool] = None

    @property
    def are_valid(self) -> bool:
        return self.initial is not None and self.subsequent is not None


@dataclasses.dataclass
class SectionTimeouts:
    """Section timeouts in seconds, NVRx's layout."""

    section: Dict[str, Optional[float]] = dataclasses.field(default_factory=dict)
    out_of_section: Optional[float] = None
    calculated_sections: Set[str] = dataclasses.field(default_factory=set)
    is_out_of_section_calculated: bool = False


def _seconds(ms):
    return None if ms is None else ms / 1000.0


class RankMonitorClient:
    """NVRx's client API mapped onto the vigil agent (see the module docstring)."""

    CURRENT_TIMEOUTS_STATE_KEY = "current_timeouts"

    def __init__(self):
        self.is_initialized = False
        self._hb = HeartbeatTimeouts()
        self._sec = SectionTimeouts()
        self.loaded_state = None
        self.logger = logging.getLogger(__name__)

    def _ensure_is_ready(self):
        if not self.is_initialized:
            raise RankMonitorClientError("RankMonitorClient is not initialized")

    def _refresh(self):
        t = vigil.timeouts()
        if t is None:
            return
        self._hb.initial = _seconds(t["initial_ms"])
        self._hb.subsequent = _seconds(t["heartbeat_ms"])
        self._sec.section = {name: ms / 1000.0 for name, ms in t["sections"].items()}
        self._sec.out_of_section = _seconds(t["out_of_section_ms"])

    @property
    def hb_timeouts(self) -> HeartbeatTimeouts:
        """The heartbeat timeouts in force (as the agent last reported them)."""
        if self.is_initialized:
            self._refresh()
        return self._hb

    @property
    def section_timeouts(self) -> SectionTimeouts:
        """The section timeouts in force (as the agent last reported them)."""
        if self.is_initialized:
            self._refresh()
        return self._sec

    def init_workload_monitoring(self, *args, **kwargs) -> None:
        """Connects to the vigil agent, registers this rank and tells the agent that this code
        calculates timeouts when it asks.

        Arguments of any NVRx release (``num_warmup_iters``, ``get_state_dict_cb``, ...) are
        accepted and ignored: the agent owns that configuration (``--warmup-steps``).
        """
        if self.is_initialized:
            raise RankMonitorClientError("RankMonitorClient is already initialized")
        vigil.announce_calculation_on_request()
        self._hb = HeartbeatTimeouts(were_calculated=False)
        self._sec = SectionTimeouts()
        self.is_initialized = True
        self._refresh()

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

    def _not_ready(self, skip_if_not_ready):
        if skip_if_not_ready:
            return False
        raise RankMonitorClientError("Not enough data to compute timeouts.")

    def calculate_and_set_hb_timeouts(self, skip_if_not_ready: bool = False) -> bool:
        """Has the agent calculate and set the heartbeat timeouts (a collective: every rank calls
        it). True once they are in force; when too little was observed (every rank needs two
        heartbeats), False with ``skip_if_not_ready``, else ``RankMonitorClientError``. Outside
        vigil: False.
        """
        self._ensure_is_ready()
        answer = vigil.calculate_timeouts(heartbeat=True)
        if answer is None:
            return False
        if not answer["heartbeat"]:
            return self._not_ready(skip_if_not_ready)
        self._refresh()
        self._hb.were_calculated = True
        self.logger.info("Updated heartbeat timeouts: %s", self._hb)
        return True

    def calculate_and_set_section_timeouts(
        self,
        selected_sections: Optional[Collection[str]] = None,
        calc_out_of_section: bool = True,
        skip_if_not_ready: bool = False,
    ) -> bool:
        """Has the agent calculate and set the timeouts of ``selected_sections`` (every section
        observed when None; none when empty, as NVRx) and, with ``calc_out_of_section``, the out-of-section timeout
        (a collective: every rank calls it). True once they are in force; when a selected section
        was never observed, False with ``skip_if_not_ready``, else ``RankMonitorClientError``.
        Outside vigil: False.
        """
        self._ensure_is_ready()
        names = list(selected_sections) if selected_sections is not None else None
        answer = vigil.calculate_timeouts(sections=names, out_of_section=calc_out_of_section)
        if answer is None:
            return False
        # No section selected: nothing to calculate there, so nothing missing.
        sections_ok = answer["sections"] or names == []
        if not (sections_ok and (answer["out_of_section"] or not calc_out_of_section)):
            return self._not_ready(skip_if_not_ready)
        self._refresh()
        self._sec.calculated_sections |= set(names if names is not None else self._sec.section)
        self._sec.is_out_of_section_calculated |= bool(calc_out_of_section)
        self.logger.info("Updated section timeouts: %s", self._sec)
        return True

    def calculate_and_set_timeouts(self, skip_if_not_ready: bool = False) -> bool:
        """Name of ``calculate_and_set_hb_timeouts`` in NVRx releases before sections existed."""
        return self.calculate_and_set_hb_timeouts(skip_if_not_ready)

    def state_dict(self) -> Mapping[str, Any]:
        """The calculated timeouts (seconds, NVRx layout); what ``load_state_dict`` got until
        this client calculated its own."""
        hb, sec = self.hb_timeouts, self.section_timeouts
        calculated = hb.were_calculated or sec.calculated_sections or sec.is_out_of_section_calculated
        if not calculated and self.loaded_state is not None:
            return dict(self.loaded_state)
        current = {}
        if hb.are_valid and hb.were_calculated:
            current["heartbeat"] = dataclasses.asdict(hb)
        if sec.calculated_sections or sec.is_out_of_section_calculated:
            d = dataclasses.asdict(sec)
            d["calculated_sections"] = sorted(d["calculated_sections"])
            current["section"] = d
        return {self.CURRENT_TIMEOUTS_STATE_KEY: current}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Keeps ``state`` for ``state_dict()``; sends nothing (the agent keeps its own)."""
        if self.CURRENT_TIMEOUTS_STATE_KEY in state:
            self.loaded_state = {self.CURRENT_TIMEOUTS_STATE_KEY: dict(state[self.CURRENT_TIMEOUTS_STATE_KEY])}

    def send_workload_control_request(self, req: WorkloadControlRequest) -> None:
        """NVRx asks ft_launcher for an action at the next rendezvous; vigil does what it means:

        * ``Continue``: nothing changes, the next attempt proceeds as usual;
        * ``ShutdownWorkload``: no further attempt; when this one ends the job ends and is not
          requeued;
        * ``ExcludeThisNode``: vigil has no hot spares to take this node's place, so the job
          cannot go on without it in this allocation: when this attempt ends, the job ends, and
          under Slurm it is requeued with this node in ``ExcNodeList``.
        """
        self._ensure_is_ready()
        action = getattr(req, "action", None)
        if not isinstance(action, WorkloadAction):
            raise RankMonitorClientError("expected a WorkloadControlRequest, got %r" % (req,))
        if action is not WorkloadAction.Continue:
            vigil._workload_control(action.value, getattr(req, "description", ""))
