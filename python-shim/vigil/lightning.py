"""PyTorch Lightning callback for vigil, the counterpart of NVRx's ``FaultToleranceCallback``.

Sends a heartbeat (with ``trainer.global_step``) after every training batch, reports each step's
duration, and wraps the run in the sections NVRx uses: ``setup`` (from ``setup`` to the first
batch), ``step`` (each training / validation batch) and ``checkpointing`` (the strategy's
``save_checkpoint`` / ``remove_checkpoint`` and async finalisation). When the agent asks the rank to
stop, ``trainer.should_stop`` is set once the requested step is reached, so Lightning ends the fit
cleanly. With ``autoresume=True`` a completed fit (``max_steps`` / ``max_epochs`` reached) tells
the agent the job is finished, in place of NVRx's finished-flag file.

Importing this module works without Lightning; creating the callback then raises ImportError.
"""

import logging
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
        if self.stop_on_request and vigil.should_stop():
            at = vigil.stop_step()
            if at is None or step >= at:
                self.logger.warning(
                    "vigil agent asked to stop (%s) at step %s: stopping the fit", vigil.stop_reason(), step
                )
                trainer.should_stop = True
                self._stopped_by_agent = True

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
