"""PyTorch Lightning callbacks for vigil, the counterparts of NVRx's ``FaultToleranceCallback`` and
``StragglerDetectionCallback`` (the latter at the end of this module; docs/stragglers.md).

Sends a heartbeat (with ``trainer.global_step``) after every training batch, reports each step's
duration, and wraps the run in the sections NVRx uses: ``setup`` (from ``setup`` to the first
batch), ``step`` (each training / validation batch) and ``checkpointing`` (the strategy's
``save_checkpoint`` / ``remove_checkpoint`` and async finalisation).

When the agent asks the job to stop (time limit, preemption), every rank reaches the same agreed
step (``vigil.should_stop(trainer.global_step)``, called after each training batch); there the
callback does what NeMo's ``PreemptionCallback`` does in ``on_train_batch_end``: it saves the last
checkpoint (the checkpoint callback's ``last`` checkpoint, as NeMo 1 did with
``_save_last_checkpoint``) and sets ``trainer.should_stop`` so Lightning ends the fit cleanly and
the script exits 0. No torch broadcast per step is needed: the agents agree on the step. With ``autoresume=True`` a completed fit (``max_steps`` / ``max_epochs`` reached) tells
the agent the job is finished, in place of NVRx's finished-flag file.

Importing this module works without Lightning; creating a callback then raises ImportError.
"""

import logging
import os
import time

import vigil


def _callback_base():
    try:
        from lightning.pytorch.callbacks import Callback

        return Callback
    except ImportError:
        pass
    try:
        from pytorch_lightning.callbacks import Callback

        return Callback
    except ImportError:
        return None


_Callback = _callback_base()
LIGHTNING_AVAILABLE = _Callback is not None

SETUP, STEP, CHECKPOINTING = "setup", "step", "checkpointing"


def _save_stop_checkpoint(trainer, path, logger, owner):
    """Saves where the next allocation resumes. Every rank calls this at the same step, so the
    collective inside ``trainer.save_checkpoint`` lines up as in any scheduled save."""
    cb = getattr(trainer, "checkpoint_callback", None)
    if path is None and cb is not None:
        if getattr(cb, "save_last", False) and hasattr(cb, "_save_last_checkpoint"):
            # NeMo's PreemptionCallback (1.x) saves exactly so; it keeps the callback's own
            # bookkeeping (last_model_path, the "last" symlink) right.
            cb._save_last_checkpoint(trainer, cb._monitor_candidates(trainer))
            return
        dirpath = getattr(cb, "dirpath", None)
        if dirpath:
            name = getattr(cb, "CHECKPOINT_NAME_LAST", None) or "last"
            path = os.path.join(dirpath, name + getattr(cb, "FILE_EXTENSION", ".ckpt"))
    if path is None:
        logger.warning(
            "vigil: stopping without a checkpoint: the trainer has no checkpoint callback; pass "
            "stop_checkpoint_path= to %s to save one" % owner
        )
        return
    trainer.save_checkpoint(path)


class FaultToleranceCallback(_Callback or object):
    """Heartbeats and sections for a Lightning ``fit``; see the module docstring.

    The arguments mirror NVRx's. With ``calculate_timeouts=False`` (NVRx's default) the configured
    timeouts stay as they are: the callback tells the agent so when the fit starts. With True the
    agent calculates them from what it observes when it runs with ``--calculate-timeouts``
    (docs/hangs.md) and stores them itself;
    ``exp_dir`` is accepted for compatibility. ``simulated_fault_params`` is not supported (vigil
    injects faults from the agent side).

    ``stop_on_request`` (default True): stop the fit at the agreed step. ``save_on_stop`` (default
    True): save a checkpoint there first, to ``stop_checkpoint_path`` when given, else the
    trainer's checkpoint callback's last checkpoint (``save_last`` set: its own
    ``_save_last_checkpoint``; otherwise ``<dirpath>/last.ckpt``); without either, the fit stops
    without saving and a warning says so.
    """

    def __init__(
        self,
        autoresume=False,
        calculate_timeouts=False,
        simulated_fault_params=None,
        exp_dir=None,
        logger_name="vigil.FaultToleranceCallback",
        exc_handling_policy=None,
        stop_on_request=True,
        save_on_stop=True,
        stop_checkpoint_path=None,
    ):
        if not LIGHTNING_AVAILABLE:
            raise ImportError(
                "vigil.lightning.FaultToleranceCallback needs PyTorch Lightning: "
                "install 'lightning' (or the older 'pytorch_lightning')"
            )
        super().__init__()
        if simulated_fault_params:
            raise ValueError("simulated_fault_params is not supported by vigil's callback")
        self.autoresume = autoresume
        self.calculate_timeouts = calculate_timeouts
        self.exp_dir = exp_dir
        self.exc_handling_policy = exc_handling_policy
        self.stop_on_request = stop_on_request
        self.save_on_stop = save_on_stop
        self.stop_checkpoint_path = stop_checkpoint_path
        self.logger = logging.getLogger(logger_name)
        self._active = False
        self._open = {}
        self._batch_start = None
        self._train_batches = 0
        self._failed = False
        self._stopped_by_agent = False

    def _start(self, name):
        n = self._open.get(name, 0)
        self._open[name] = n + 1
        if n == 0:
            vigil.start_section(name)

    def _end(self, name):
        n = self._open.get(name, 0)
        if n == 1:
            vigil.end_section(name)
        if n > 0:
            self._open[name] = n - 1

    def _wrap(self, obj, method, name):
        original = getattr(obj, method, None)
        if not callable(original) or getattr(original, "_vigil_wrapped", False):
            return

        def wrapped(*args, **kwargs):
            if not self._active:
                return original(*args, **kwargs)
            self._start(name)
            try:
                return original(*args, **kwargs)
            finally:
                self._end(name)

        wrapped._vigil_wrapped = True
        setattr(obj, method, wrapped)

    def setup(self, trainer, pl_module, stage):
        if stage != "fit":
            return
        self._active = True
        self._open = {}
        self._train_batches = 0
        self._failed = False
        self._stopped_by_agent = False
        strategy = getattr(trainer, "strategy", None)
        if strategy is not None:
            self._wrap(strategy, "save_checkpoint", CHECKPOINTING)
            self._wrap(strategy, "remove_checkpoint", CHECKPOINTING)
            io = getattr(strategy, "checkpoint_io", None)
            if io is not None:
                self._wrap(io, "maybe_finalize_save_checkpoint", CHECKPOINTING)
        if not self.calculate_timeouts:
            vigil.announce_calculation_on_request()
        self._start(SETUP)
        vigil.heartbeat()

    def on_train_start(self, trainer, pl_module):
        if self._active:
            vigil.heartbeat()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx, *args):
        if not self._active:
            return
        self._end(SETUP)
        self._start(STEP)
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        if not self._active:
            return
        self._end(STEP)
        self._train_batches += 1
        step = int(trainer.global_step)
        if self._batch_start is not None:
            vigil.step_timing(step, time.perf_counter() - self._batch_start)
            self._batch_start = None
        vigil.heartbeat(step)
        if self.stop_on_request and not self._stopped_by_agent and vigil.should_stop(step):
            self._stopped_by_agent = True
            self.logger.warning(
                "vigil agent asked to stop (%s): stopping the fit at step %s", vigil.stop_reason(), step
            )
            if self.save_on_stop:
                self._save_stop_checkpoint(trainer)
            trainer.should_stop = True

    def _save_stop_checkpoint(self, trainer):
        _save_stop_checkpoint(trainer, self.stop_checkpoint_path, self.logger, "FaultToleranceCallback")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, *args):
        if self._active:
            self._end(SETUP)
            self._start(STEP)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        if self._active:
            self._end(STEP)
            vigil.heartbeat()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if self._active:
            vigil.heartbeat()

    def on_exception(self, trainer, pl_module, exception):
        if not self._active:
            return
        self._failed = not (isinstance(exception, SystemExit) and not exception.code)
        vigil.end_all_sections()
        self._open = {}
        if self.exc_handling_policy is not None:
            self.exc_handling_policy(exception)

    def teardown(self, trainer, pl_module, stage):
        if stage != "fit" or not self._active:
            return
        vigil.end_all_sections()
        self._open = {}
        vigil.heartbeat()
        if self.autoresume and self._training_completed(trainer):
            vigil.mark_finished()
        self._active = False

    def _training_completed(self, trainer):
        if self._failed or self._stopped_by_agent:
            return False
        max_steps = getattr(trainer, "max_steps", None)
        if isinstance(max_steps, int) and max_steps > 0 and trainer.global_step >= max_steps:
            return True
        max_epochs = getattr(trainer, "max_epochs", None)
        if isinstance(max_epochs, int) and max_epochs > 0 and trainer.current_epoch >= max_epochs:
            return True
        # A run that ends after at most one batch without failing had nothing left to do.
        return self._train_batches <= 1


# The agent's straggler settings, exported by `vigil run` to every rank, and the flag that sets each.
INTERVAL_ENV, THRESHOLD_ENV, STOP_ENV = (
    "VIGIL_STRAGGLER_INTERVAL",
    "VIGIL_STRAGGLER_THRESHOLD",
    "VIGIL_STOP_IF_STRAGGLER",
)


def _env_float(name):
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return None


def _differs(a, b):
    try:
        return abs(float(a) - b) > 1e-9 * max(1.0, abs(b))
    except (TypeError, ValueError):
        return True  # not a number: the agent's value applies all the same


class StragglerDetectionCallback(_Callback or object):
    """NVRx's ``StragglerDetectionCallback`` surface; the scoring is the agent's (docs/stragglers.md).

    Times each training batch and sends it as ``vigil.step_timing(global_step, seconds)``; the
    agents score every rank from those and node rank 0 prints NVRx's report. When the trainer also
    has a :class:`FaultToleranceCallback`, that one already sends the step times (and handles stop
    requests), so this one sends nothing.

    The settings are the agent's (``vigil run`` flags, exported to every rank as
    ``VIGIL_STRAGGLER_*``); when an argument here differs, one warning names the flag that sets it:
    ``report_time_interval`` (``--straggler-report-interval``), ``gpu_relative_perf_threshold`` and
    ``gpu_individual_perf_threshold`` (``--straggler-threshold``, one value for both) and
    ``stop_if_detected`` (``--stop-if-straggler``). The agent always computes both scores and
    prints the worst and best 5, so ``calc_relative_gpu_perf``, ``calc_individual_gpu_perf``,
    ``num_gpu_perf_scores_to_print`` and ``profiling_interval`` are accepted for compatibility;
    with ``enable_ptl_logging`` a warning says the scores are in the agent's event log instead.

    When the agent stops the job at an agreed step (``--stop-if-straggler``, or any other stop
    request), this callback, like :class:`FaultToleranceCallback`, saves the last checkpoint there
    and ends the fit (``stop_on_request``, ``save_on_stop``, ``stop_checkpoint_path`` as there).
    """

    def __init__(
        self,
        report_time_interval=300.0,
        calc_relative_gpu_perf=True,
        calc_individual_gpu_perf=True,
        num_gpu_perf_scores_to_print=5,
        gpu_relative_perf_threshold=0.7,
        gpu_individual_perf_threshold=0.7,
        stop_if_detected=False,
        enable_ptl_logging=False,
        profiling_interval=1,
        logger_name="vigil.StragglerDetectionCallback",
        stop_on_request=True,
        save_on_stop=True,
        stop_checkpoint_path=None,
    ):
        if not LIGHTNING_AVAILABLE:
            raise ImportError(
                "vigil.lightning.StragglerDetectionCallback needs PyTorch Lightning: "
                "install 'lightning' (or the older 'pytorch_lightning')"
            )
        super().__init__()
        if not (calc_relative_gpu_perf or calc_individual_gpu_perf):
            raise ValueError(
                "no straggler score selected: set calc_relative_gpu_perf=True or calc_individual_gpu_perf=True"
            )
        self.report_time_interval = report_time_interval
        self.calc_relative_gpu_perf = calc_relative_gpu_perf
        self.calc_individual_gpu_perf = calc_individual_gpu_perf
        self.num_gpu_perf_scores_to_print = num_gpu_perf_scores_to_print
        self.gpu_relative_perf_threshold = gpu_relative_perf_threshold
        self.gpu_individual_perf_threshold = gpu_individual_perf_threshold
        self.stop_if_detected = stop_if_detected
        self.enable_ptl_logging = enable_ptl_logging
        self.profiling_interval = profiling_interval
        self.stop_on_request = stop_on_request
        self.save_on_stop = save_on_stop
        self.stop_checkpoint_path = stop_checkpoint_path
        self.logger = logging.getLogger(logger_name)
        self._checked = False
        self._active = False
        self._batch_start = None
        self._stopped_by_agent = False

    def differences(self):
        """One message per agent setting this callback's arguments disagree with (``[]`` if none)."""
        out = []
        interval = _env_float(INTERVAL_ENV)
        if interval is not None and _differs(self.report_time_interval, interval):
            out.append(
                "report_time_interval=%s differs from the agent's report interval (%g s), which applies: "
                "set it with `vigil run --straggler-report-interval %s`"
                % (self.report_time_interval, interval, self.report_time_interval)
            )
        threshold = _env_float(THRESHOLD_ENV)
        if threshold is not None:
            differing = [
                (name, value)
                for name, value in (
                    ("gpu_relative_perf_threshold", self.gpu_relative_perf_threshold),
                    ("gpu_individual_perf_threshold", self.gpu_individual_perf_threshold),
                )
                if _differs(value, threshold)
            ]
            if differing:
                values = set(str(v) for _, v in differing)
                flag = "--straggler-threshold %s" % values.pop() if len(values) == 1 else "--straggler-threshold"
                out.append(
                    "%s differs from the agent's straggler threshold (%g, one value for both scores), "
                    "which applies: set it with `vigil run %s`"
                    % (" and ".join("%s=%s" % d for d in differing), threshold, flag)
                )
        stop = os.environ.get(STOP_ENV)
        if stop in ("0", "1") and bool(self.stop_if_detected) != (stop == "1"):
            if self.stop_if_detected:
                out.append(
                    "stop_if_detected=True but the agent keeps training when it finds a straggler: "
                    "add `--stop-if-straggler` to `vigil run`"
                )
            else:
                out.append(
                    "stop_if_detected=False but the agent stops the job when it finds a straggler: "
                    "remove `--stop-if-straggler` from `vigil run`"
                )
        if self.enable_ptl_logging:
            out.append(
                "enable_ptl_logging: the scores are not logged to Lightning's loggers; they are in the "
                "agent's event log (`straggler_report` records, docs/stragglers.md)"
            )
        return out

    def setup(self, trainer, pl_module, stage):
        if stage != "fit":
            return
        if not self._checked:
            self._checked = True
            for message in self.differences():
                self.logger.warning("vigil: StragglerDetectionCallback: %s", message)
        callbacks = getattr(trainer, "callbacks", None) or []
        # A FaultToleranceCallback on the same trainer times the batches and handles stops already.
        self._active = not any(isinstance(cb, FaultToleranceCallback) for cb in callbacks)
        self._batch_start = None
        self._stopped_by_agent = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx, *args):
        if self._active:
            self._batch_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        if not self._active:
            return
        step = int(trainer.global_step)
        if self._batch_start is not None:
            vigil.step_timing(step, time.perf_counter() - self._batch_start)
            self._batch_start = None
        if self.stop_on_request and not self._stopped_by_agent and vigil.should_stop(step):
            self._stopped_by_agent = True
            self.logger.warning(
                "vigil agent asked to stop (%s): stopping the fit at step %s", vigil.stop_reason(), step
            )
            if self.save_on_stop:
                _save_stop_checkpoint(trainer, self.stop_checkpoint_path, self.logger, "StragglerDetectionCallback")
            trainer.should_stop = True

    def teardown(self, trainer, pl_module, stage):
        if stage == "fit":
            self._active = False
