"""PyTorch Lightning callback for vigil, the counterpart of NVRx's ``FaultToleranceCallback``.

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

Importing this module works without Lightning; creating the callback then raises ImportError.
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


class FaultToleranceCallback(_Callback or object):
    """Heartbeats and sections for a Lightning ``fit``; see the module docstring.

    The arguments mirror NVRx's. With ``calculate_timeouts=False`` (NVRx's default) the configured
    timeouts stay as they are: the callback tells the agent so when the fit starts. With True the
    agent calculates them from what it observes (docs/hangs.md) and stores them itself;
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
        """Saves where the next allocation resumes. Every rank calls this at the same step, so the
        collective inside ``trainer.save_checkpoint`` lines up as in any scheduled save."""
        path = self.stop_checkpoint_path
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
            self.logger.warning(
                "vigil: stopping without a checkpoint: the trainer has no checkpoint callback; pass "
                "stop_checkpoint_path= to FaultToleranceCallback to save one"
            )
            return
        trainer.save_checkpoint(path)

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
