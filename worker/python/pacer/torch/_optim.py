"""``distribute``: the user's torch optimizer mapped onto the shards'
(its kind, each param_group's settings), and ``DistributedOptimizer``,
whose ``step()`` pushes the gradient with each group's current lr."""

import copy
import math
import warnings
import weakref

import numpy as np
import torch

from ._runtime import _require, _wait_for_copies

# torch.optim class -> (the shards' kind, the settings the shards take).
SUPPORTED_OPTIMIZERS = {
    torch.optim.SGD: ("sgd", ("lr", "momentum", "dampening", "weight_decay", "nesterov")),
    torch.optim.Adam: ("adam", ("lr", "betas", "eps", "weight_decay", "amsgrad")),
    torch.optim.AdamW: ("adamw", ("lr", "betas", "eps", "weight_decay", "amsgrad")),
    torch.optim.Adagrad: ("adagrad", ("lr", "lr_decay", "weight_decay",
                                      "initial_accumulator_value", "eps")),
}
# Options that choose how torch computes, not what: nothing to map.
_HOW_NOT_WHAT = ("foreach", "capturable", "fused", "differentiable")


def _glob_escape(name):
    # fnmatch(3): a backslash makes the next character literal.
    return "".join("\\" + c if c in "*?[]\\" else c for c in name)


def _setting_text(key, value):
    if key == "betas":
        return "betas=%r:%r" % (float(value[0]), float(value[1]))
    if isinstance(value, bool):
        return "%s=%s" % (key, "true" if value else "false")
    if isinstance(value, torch.Tensor):
        value = value.item()
    return "%s=%r" % (key, float(value))


def _settings(kind, keys, group, what):
    """The settings of one torch param_group, checked against what the shards take."""
    for key, value in group.items():
        if key == "params" or key in keys:
            continue
        if key == "maximize" and value:
            raise TypeError("%s: maximize=True is not supported: the shards minimise "
                            "(negate the loss instead)" % what)
        if key in _HOW_NOT_WHAT or key == "maximize" or key == "initial_lr":
            continue
        raise TypeError("%s: option %r is not supported by the shards' %s (they take %s)"
                        % (what, key, kind, ", ".join(keys)))
    return {k: group[k] for k in keys if k in group}


def _declaration(optimizer, named, role):
    """What the shards run for ``optimizer`` over the module's parameters
    ``named``: (kind, the groups' specs, (pacer group, torch group, settings
    but lr) per group, the default group's settings)."""
    entry = SUPPORTED_OPTIMIZERS.get(type(optimizer))
    if entry is None:
        raise TypeError("pacer.torch.distribute: %s%s is not supported; the shards run %s%s"
                        % (role, type(optimizer).__name__,
                           ", ".join("torch.optim." + c.__name__ for c in SUPPORTED_OPTIMIZERS),
                           "" if role else " (in a job of local steps, pacer-monitor --mode "
                           "local, any optimizer runs on the worker: pass outer=)"))
    kind, keys = entry
    name_of = {id(p): n for n, p in named}
    groups, group_settings, seen = [], [], set()
    for i, g in enumerate(optimizer.param_groups):
        what = "%storch.optim.%s param_groups[%d]" % (role, type(optimizer).__name__, i)
        settings = _settings(kind, keys, g, what)
        names = []
        for p in g["params"]:
            if id(p) not in name_of:
                raise ValueError("%s holds a tensor that is not a trainable parameter of the "
                                 "module" % what)
            if id(p) in seen:
                raise ValueError("%s: a parameter is in two groups" % what)
            seen.add(id(p))
            names.append(name_of[id(p)])
        if not names:
            continue
        spec = ",".join(_setting_text(k, v) for k, v in settings.items())
        groups.append("group%d:%s:%s" % (i, ",".join(_glob_escape(n) for n in names), spec))
        group_settings.append((len(groups), g, {k: v for k, v in settings.items() if k != "lr"}))
    missing = [n for n, p in named if id(p) not in seen]
    if missing:
        raise ValueError("pacer.torch.distribute: the %soptimizer does not train %s; give it "
                         "every trainable parameter (or set requires_grad=False)"
                         % (role, ", ".join(missing)))
    # The job's optimizer: this one, with its defaults as the default
    # group's settings (a setting torch leaves unset, as SGD's lr may be,
    # takes the shards' default). The first worker's sets the job's.
    defaults = {k: v for k, v in optimizer.defaults.items()
                if k in keys and isinstance(v, (bool, int, float, tuple, list, torch.Tensor))}
    default_spec = ",".join(_setting_text(k, v) for k, v in defaults.items())
    return kind, groups, group_settings, default_spec


def distribute(module, optimizer, evaluate=None, outer=None):
    """Hands ``module``'s parameters and ``optimizer``'s updates to the shards.
    Returns (module, a DistributedOptimizer to call step() and zero_grad() on).
    The module trains in place: its parameters become views of the runtime's
    buffers once the DataLoader starts the run.

    ``evaluate`` (optional): ``evaluate(model)`` returns the test accuracy
    (a number), or ``(accuracy, loss)``, or ``(accuracy, loss, samples)``.
    It runs on a side thread when the monitor asks this worker to evaluate
    (every ``--eval-interval`` seconds, on the live worker of lowest rank),
    on a copy of the module holding the latest parameters from the shards,
    in eval mode and under ``torch.no_grad()``, while the loop trains on;
    the monitor logs each result and stops the job at
    ``--target-accuracy``. No evaluation inside the loop is needed.

    ``outer`` (optional; for a job of rounds of local steps, pacer-monitor
    ``--mode local``): a torch optimizer over the same parameters that the
    shards run on the rounds' changes, e.g. ``torch.optim.SGD(params,
    lr=0.7, momentum=0.9, nesterov=True)`` (DiLoCo's; without ``outer`` the
    job's: pacer-monitor's ``--optimizer``, by default that one). In that
    mode ``optimizer`` runs here, on this worker's own copy of the
    parameters, and with ``outer`` given may be any torch optimizer;
    ``opt.step()`` steps it, and at a round's end pushes the change of the
    parameters since the round began. ``outer`` given in another mode: the
    run refuses to start."""
    state = _require()
    if evaluate is not None and not callable(evaluate):
        raise TypeError("pacer.torch.distribute: evaluate must be a function of the model")
    if state.pending is not None or state.started:
        raise RuntimeError("pacer.torch.distribute: one model per worker process")
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("pacer.torch.distribute: the module has no trainable parameters")
    # What the shards run: the optimizer (a job of steps on the shards), or
    # the outer one (a job of local steps, where the optimizer runs here).
    kind, groups, group_settings, default_spec = None, [], [], ""
    if outer is None:
        kind, groups, group_settings, default_spec = _declaration(optimizer, named, "")
    local = None if outer is None else _declaration(outer, named, "outer=")
    for n, p in named:
        if p.dtype != torch.float32:
            raise TypeError("pacer.torch.distribute: %s is %s; the shards hold float32"
                            % (n, p.dtype))
    if any(True for _ in module.buffers()):
        warnings.warn("pacer.torch: the module's buffers (such as BatchNorm's running "
                      "statistics) are not shared: each worker keeps and updates its own",
                      stacklevel=2)
    init_values = np.concatenate(
        [p.detach().to("cpu").reshape(-1).numpy().astype(np.float32) for _, p in named])
    state.pending = ([n for n, _ in named], [p.numel() for _, p in named], init_values, named,
                     groups, kind or "", default_spec, local)
    state.evaluate = None if evaluate is None else _SideEvaluation(module, named, evaluate)
    state.optimizer = DistributedOptimizer(optimizer, group_settings, kind, outer,
                                           local[2] if local else [])
    return module, state.optimizer


class _SideEvaluation:
    """``evaluate`` as the runtime calls it on its evaluation thread: the
    pulled parameters (a flat float32 array) copied into a copy of the
    module made now, and (accuracy, loss, samples) back."""

    def __init__(self, module, named, evaluate):
        # Weakly: the module's parameters become views of the runtime's
        # buffers, and the runtime holds this object.
        self.live = weakref.ref(module)
        self.model = copy.deepcopy(module)
        own = dict(self.model.named_parameters())
        self.params = [own[n] for n, _ in named]
        self.evaluate = evaluate

    def __call__(self, flat):
        values = torch.from_numpy(flat)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(values[offset:offset + n].view(p.shape))
                offset += n
            # Buffers (BatchNorm's statistics) are the worker's own: the
            # training module's current ones.
            live = self.live()
            if live is not None:
                for mine, theirs in zip(self.model.buffers(), live.buffers()):
                    mine.copy_(theirs)
            self.model.eval()
            result = self.evaluate(self.model)
        if isinstance(result, torch.Tensor):
            result = result.item()
        if isinstance(result, (tuple, list)):
            result = tuple(float(v.item() if isinstance(v, torch.Tensor) else v) for v in result)
        else:
            result = (float(result),)
        if not 1 <= len(result) <= 3 or not math.isfinite(result[0]):
            raise ValueError("pacer.torch: evaluate(model) must return an accuracy, or "
                             "(accuracy, loss[, samples]); it returned %r" % (result,))
        accuracy, loss, samples = (result + (float("nan"), 0))[:3]
        return accuracy, loss, int(samples)


class DistributedOptimizer(torch.optim.Optimizer):
    """The user's optimizer, stepped on the shards. ``param_groups`` are the
    user's own (an lr_scheduler changes their lr, which each push carries).
    In a job of local steps (pacer-monitor --mode local) the user's
    optimizer steps here, and ``outer`` (the shards') takes the rounds'
    changes: its groups' lr is what each round's push carries."""

    def __init__(self, inner, group_settings, kind, outer=None, outer_settings=()):
        # Not Optimizer.__init__: the groups and defaults are the inner one's.
        self.inner = inner
        self.defaults = inner.defaults
        self.param_groups = inner.param_groups
        self.state = {}
        self.kind = kind
        self.outer = outer
        self._declared = group_settings  # (pacer group, torch group, settings but lr)
        self._outer_declared = list(outer_settings)
        self._hook_for_increment_step = None

    def __getstate__(self):
        return {"kind": self.kind}

    def __repr__(self):
        if self.kind is None:
            return "pacer.torch.DistributedOptimizer(%r here, %r on the shards)" % (
                self.inner, self.outer)
        return "pacer.torch.DistributedOptimizer(%r on the shards)" % (self.inner,)

    @staticmethod
    def _lrs(declared):
        """Each declared group's lr now, after checking that nothing else
        the shards fixed at the start changed."""
        lrs = []
        for group_id, group, settings in declared:
            for key, value in settings.items():
                now = group.get(key)
                if (tuple(now) if key == "betas" else now) != (tuple(value) if key == "betas"
                                                               else value):
                    raise RuntimeError(
                        "pacer.torch: %s of a param_group changed from %r to %r while training "
                        "(a scheduler?); the shards fix everything but lr at the start"
                        % (key, value, now))
            lr = group["lr"]
            lrs.append((group_id, float(lr.item() if isinstance(lr, torch.Tensor) else lr)))
        return lrs

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradient buffer the push sends (never sets it to None:
        backward accumulates into that buffer)."""
        state = _require()
        if not state.started:
            self.inner.zero_grad()
            return
        for p, _, host_g in state.views:
            if p.grad is not None and p.grad.data_ptr() != host_g.data_ptr():
                p.grad.zero_()
        state.trainer.grads.fill(0.0)

    def step(self, closure=None, loss=None):
        """Pushes the gradient (with each group's lr) and waits for the
        shards' acknowledgement. ``loss`` (optional) shows in progress lines
        and pacer_training_loss."""
        if closure is not None:
            raise TypeError("pacer.torch: step(closure) is not supported: the shards step once "
                            "per push")
        state = _require()
        if not state.started:
            raise RuntimeError("pacer.torch: step() before the DataLoader's first batch")
        if not state.planned:
            raise RuntimeError("pacer.torch: step() once per batch the DataLoader yields")
        if state.trainer.local_steps:
            return self._local_step(state, loss)
        state.trainer.set_learning_rates(self._lrs(self._declared))
        for p, host_p, _ in state.views:
            if p.shape != host_p.shape:
                raise RuntimeError("pacer.torch: a parameter changed shape from %s to %s while "
                                   "training; the shards hold the shapes distribute() declared"
                                   % (tuple(host_p.shape), tuple(p.shape)))
        copied = False
        for p, _, host_g in state.views:
            # A gradient that is not the buffer (a device model, or grad
            # replaced): copy it in.
            if p.grad is None:
                host_g.zero_()
            elif p.grad.data_ptr() != host_g.data_ptr():
                host_g.copy_(p.grad.detach(), non_blocking=bool(state.pinned))
                copied = True
        if copied:
            _wait_for_copies(state)  # the gradients are in before the push
        if isinstance(loss, torch.Tensor):
            loss = loss.detach().item()
        state.planned = False
        # A scheduler made on the user's own optimizer counts that
        # optimizer's steps (torch wraps its step() to count them, and warns
        # of a schedule stepped first); the shards took this step for it.
        if hasattr(self.inner, "_step_count"):
            self.inner._step_count += 1
        self.inner._opt_called = True  # what newer torch checks instead
        state.trainer.push(float("nan") if loss is None else float(loss))
        return None

    def _local_step(self, state, loss):
        """A local step (mode local): the user's optimizer steps the
        parameters here; the runtime pushes the round's change when the
        round is due, with the outer groups' lr."""
        self.inner.step()
        if state.pinned or any(p.data.data_ptr() != host_p.data_ptr()
                               for p, host_p, _ in state.views):
            # A device model: the round's change is taken from the runtime's
            # buffer.
            with torch.no_grad():
                for p, host_p, _ in state.views:
                    if p.data.data_ptr() != host_p.data_ptr():
                        host_p.copy_(p.data)
        state.trainer.set_learning_rates(self._lrs(self._outer_declared))
        if isinstance(loss, torch.Tensor):
            loss = loss.detach().item()
        state.planned = False
        state.trainer.push(float("nan") if loss is None else float(loss))
        return None
