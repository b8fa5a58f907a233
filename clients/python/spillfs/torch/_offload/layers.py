"""The layers the offloader follows, and the module hooks on them.

:func:`find_layers` picks a model's repeated blocks. Every tensor pack sees is
tagged with a group (:meth:`_LayerHooks.current_group`): the innermost layer
running (a stack kept by the pre and post hooks), -1 before the first layer,
``_HEAD`` after the last one; without layers, runs of ``group_bytes`` bytes in
the order of saving. A group is what the policy decides for, what a file holds
and what the prefetcher reads ahead.

The hooks of a step (installed at ``__enter__``, removed at ``__exit__``):

- a global forward pre-hook notes each module's parameters and buffers by
  their storage (pack leaves them where they are: :meth:`is_parameter`);
- a layer's forward pre-hook stores the pending tensor (it is not the last
  before backward) and lets the originals of layers more than ``copy_window``
  back go (:meth:`_layer_begins`);
- the last layer's forward post-hook drains the copies in flight where
  ``inflight_bytes`` is set (memory-tight: the head runs without the layers'
  activations); every layer's post-hook puts a hook on its output's gradient,
  which fires as that layer's backward begins: backward's phase starts there,
  and the prefetcher reads from that layer down (:mod:`.read_ahead`);
- :meth:`mark` times the layers for the policy's profile (CUDA events on the
  compute stream where CUDA is initialized, else the host clock), in the steps
  the policy times (``wants_timing``), with the allocator's peak per phase
  where it asks (``wants_memory``);
- where the policy names the layers whose saved tensors it stores
  (``hooked_layers``), the saved-tensor hooks are pushed by those layers'
  pre-hooks and popped by their post-hooks, not held for the whole step; a
  step with no saved-tensor hooks and no timing installs no module hook;
- the layers the policy recomputes run under non-reentrant activation
  checkpointing for the step (:meth:`wrap_recompute`).

Threading: the forward hooks run on the thread running forward, the gradient
hook on the one autograd runs backward on; each takes the offloader's lock
around the state it shares with the worker.
"""

import time

import torch

from .entries import _storage_ptr

__all__ = ["find_layers"]

_HEAD = "head"  # the group of what is saved after the last layer (the output head and the loss)


def find_layers(model):
    r"""The repeated blocks of `model`: the longest :class:`torch.nn.ModuleList`
    or :class:`torch.nn.Sequential` whose children are all of one type (the
    most parameters on a tie), or the children of `model` itself where it is a
    :class:`torch.nn.Sequential`; an empty list where there is none."""
    best, best_key = None, None
    for module in model.modules():
        if not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        children = list(module.children())
        if len(children) < 2 or len({type(c) for c in children}) != 1:
            continue
        key = (len(children), sum(p.numel() for p in module.parameters()))
        if best_key is None or key > best_key:
            best, best_key = children, key
    if best is not None:
        return best
    if isinstance(model, torch.nn.Sequential):
        return list(model.children())
    return []


# What selective checkpointing keeps: the outputs of the matrix products and of attention (the costly
# ops); everything else (norms, activations, rotary embeddings, casts: cheap, memory-bound, and much of
# what a transformer block saves) is recomputed in backward.
_SELECTIVE_SAVE_OPS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention",
                       "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                       "_scaled_dot_product_flash_attention_for_cpu", "_flash_attention_forward",
                       "_efficient_attention_forward")


def selective_available():
    """Whether this torch has selective activation checkpointing (2.4 and later)."""
    import torch.utils.checkpoint as checkpoint
    return hasattr(checkpoint, "create_selective_checkpoint_contexts")


def selective_context():
    """The ``context_fn`` of :func:`torch.utils.checkpoint.checkpoint` for a selectively
    recomputed layer: the outputs of ``_SELECTIVE_SAVE_OPS`` kept, the rest recomputed."""
    import torch.utils.checkpoint as checkpoint
    ops = []
    for name in _SELECTIVE_SAVE_OPS:
        packet = getattr(torch.ops.aten, name, None)
        for overload in (packet.overloads() if packet is not None else ()):
            ops.append(getattr(packet, overload))
    return checkpoint.create_selective_checkpoint_contexts(ops)


_checkpoint_input_saves = None


def checkpoint_input_saves():
    """Tensors a non-reentrant :func:`torch.utils.checkpoint.checkpoint` of a layer with one tensor
    argument saves through the saved-tensor hooks around it (as the layer begins; its own hooks take
    the rest): the input, and in some versions (2.11) an empty placeholder too. Measured once."""
    global _checkpoint_input_saves
    if _checkpoint_input_saves is None:
        import torch.utils.checkpoint as checkpoint
        count = 0

        def pack(t):
            nonlocal count
            count += 1
            return t

        x = torch.ones(2, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            checkpoint.checkpoint(lambda v: (v * v).sum(), x, use_reentrant=False)
        _checkpoint_input_saves = max(count, 1)
    return _checkpoint_input_saves


class _LayerHooks:
    """Module hooks: groups, parameters, layer boundaries, backward's start, timing, recompute.

    Args:
        layers: a model (its layers found by :func:`find_layers`), a list of
            modules, or None.
        options: the offloader's settings (``copy_window``, ``inflight_bytes``,
            ``group_bytes``), read as it acts.
        state (_StepState): the step (its phase, the pending entry).
        lock: the offloader's lock.
        copies (:class:`~.copy_out._CopyOut`): stores the pending entry, polls
            the copies in flight as a layer begins.
        reads (:class:`~.read_ahead._ReadAhead`): reads ahead as a layer's
            backward begins.
        diagnosis (:class:`~.diagnosis._Diagnosis`): samples at each hook.
        backward_starts: called as the first layer's backward begins.
    """

    def __init__(self, layers, options, state, lock, copies, reads, diagnosis, backward_starts):
        self.model = None
        if layers is None:
            self.layers = []
        elif isinstance(layers, torch.nn.Module) and not isinstance(layers, torch.nn.ModuleList):
            self.model = layers
            self.layers = find_layers(layers)
        else:
            self.layers = list(layers)
            for m in self.layers:
                if not isinstance(m, torch.nn.Module):
                    raise TypeError(f"layers must be nn.Modules (or a model), got {type(m).__name__}")
        self._options, self._state, self._lock = options, state, lock
        self._copies, self._reads, self._diagnosis = copies, reads, diagnosis
        self._backward_starts = backward_starts
        self.marks = []
        self._hooks_ctx = None
        self._handles = []
        self._wrapped = []
        self._group_stack = []
        self._after_last_layer = False
        self._cum_bytes = 0
        self._param_ptrs = set()
        self._seen_modules = set()
        self._cuda_marks = False
        self._timed = True
        self._memory = False
        self._memory_base = 0
        # tests: an object with memory_allocated(), max_memory_allocated(), reset_peak_memory_stats()
        # instead of torch.cuda's (the CPU has no allocator figures)
        self.memory_probe = None
        self.memory_marks = []  # (layer whose backward begins, or "end"; peak bytes of the phase ending)
        self._hooked = None
        self._pack_unpack = None
        self._layer_ctx = []  # (layer index, saved-tensor hooks pushed by its pre-hook)
        self.record_inputs = False  # the policy's profile: bytes of each layer's tensor arguments
        self.input_bytes = {}

    def begin_step(self):
        self._group_stack = []
        self._after_last_layer = False
        self._cum_bytes = 0
        self.marks = []
        self.memory_marks = []
        self.input_bytes = {}
        # CUDA's events and allocator figures only for layers on CUDA: a CPU model in a process that
        # has used CUDA (a test run on a GPU machine) has none of its memory there
        modules = [self.model] if self.model is not None else self.layers
        on_cuda = any(p.is_cuda for m in modules for p in m.parameters())
        self._cuda_marks = on_cuda and torch.cuda.is_available() and torch.cuda.is_initialized()
        self._param_ptrs = set()
        self._seen_modules = set()
        if self.model is not None:
            self._see_module(self.model)

    def new_forward(self):
        """A forward starts after a finished backward in the same step (gradient accumulation)."""
        self._after_last_layer = False

    @property
    def cuda_marks(self):
        """Whether the step is timed by CUDA events (CUDA was initialized as it began)."""
        return self._cuda_marks

    @property
    def group_stack(self):
        """The layers running forward, innermost last."""
        return self._group_stack

    @property
    def current_layer(self):
        """The innermost layer running forward ('-' outside every layer): for diagnosis."""
        return self._group_stack[-1] if self._group_stack else "-"

    # -- hooks ----------------------------------------------------------------

    def install(self, pack, unpack, saved=True, hooked=None, timed=True, memory=False):
        """Hooks the modules and, with `saved`, routes the saved tensors through ``pack`` and ``unpack``:
        every tensor of the step where `hooked` is None, else only those saved in the forward of the
        layers at the indices `hooked` (the saved-tensor hooks are pushed by the layer's pre-hook and
        popped by its post-hook: the other layers save at no cost per tensor). `timed`: the layers'
        boundaries are marked (:meth:`mark`: the policy's profile); `memory`: the allocator's peak of
        each phase is sampled too (:attr:`memory_marks`). With neither saved tensors nor marks, no
        module hook is installed at all: such a step costs what the model costs."""
        self._timed = timed
        self._memory = memory and (self._cuda_marks or self.memory_probe is not None)
        self._hooked = None if hooked is None else frozenset(hooked)
        self._pack_unpack = (pack, unpack)
        self._layer_ctx = []
        if not saved and not timed:
            return
        if saved and self._hooked is None:
            self._hooks_ctx = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
            self._hooks_ctx.__enter__()
        elif not saved:
            self._hooked = frozenset()
        if saved and self._hooked is None:
            # parameters found as modules run; per layer, the hooked layers' own are noted up front instead
            mm = torch.nn.modules.module
            self._handles = [mm.register_module_forward_pre_hook(self._global_pre_hook)]
        else:
            self._handles = []
            for i in sorted(self._hooked):
                self._see_module(self.layers[i])
        if self._memory:
            allocator = self.memory_probe or torch.cuda
            self._memory_base = allocator.memory_allocated()
            allocator.reset_peak_memory_stats()
        for i, layer in enumerate(self.layers):
            self._handles.append(layer.register_forward_pre_hook(self._make_pre_hook(i)))
            self._handles.append(layer.register_forward_hook(self._make_post_hook(i)))

    def wrap_recompute(self, indices, selective=()):
        """Runs the layers at `indices` under non-reentrant activation checkpointing (this step);
        those at `selective` under selective checkpointing (:func:`selective_context`: the outputs
        of matrix products and attention kept, the rest recomputed)."""
        import functools

        import torch.utils.checkpoint as checkpoint
        self._wrapped = []
        for i in sorted(set(indices) | set(selective)):
            layer = self.layers[i]
            had = "forward" in layer.__dict__
            previous = layer.__dict__.get("forward")
            inner = layer.forward
            extra = {"context_fn": selective_context} if i in selective else {}

            def forward(*args, _inner=inner, _extra=extra, **kwargs):
                fn = functools.partial(_inner, **kwargs) if kwargs else _inner
                return checkpoint.checkpoint(fn, *args, use_reentrant=False, **_extra)
            layer.forward = forward
            self._wrapped.append((layer, had, previous))

    def unwrap_recompute(self):
        for layer, had, previous in self._wrapped:
            if had:
                layer.forward = previous
            else:
                del layer.forward
        self._wrapped = []

    def uninstall(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        while self._layer_ctx:  # a hooked layer's forward raised: its post-hook never ran
            self._layer_ctx.pop()[1].__exit__(None, None, None)
        if self._memory:
            self._memory_phase_ends("end")
            self._memory = False
        if self._hooks_ctx is not None:
            ctx, self._hooks_ctx = self._hooks_ctx, None
            ctx.__exit__(None, None, None)

    def _see_module(self, module):
        if id(module) in self._seen_modules:
            return
        for m in module.modules():
            self._seen_modules.add(id(m))
        for p in module.parameters():
            if p.numel():
                self._param_ptrs.add(_storage_ptr(p))
        for b in module.buffers():
            if b.numel():
                self._param_ptrs.add(_storage_ptr(b))

    def _global_pre_hook(self, module, args):
        if id(module) not in self._seen_modules:
            with self._lock:
                self._see_module(module)

    def _make_pre_hook(self, index):
        state, copies, diagnosis = self._state, self._copies, self._diagnosis

        def hook(module, args):
            self._group_stack.append(index)
            if state.phase == "forward":
                if self._hooked is not None and index in self._hooked:
                    ctx = torch.autograd.graph.saved_tensors_hooks(*self._pack_unpack)
                    ctx.__enter__()
                    self._layer_ctx.append((index, ctx))
                if self.record_inputs:
                    self.input_bytes[index] = sum(a.numel() * a.element_size() for a in _tensors(args))
                self.mark("fwd_start", index)
                if state.pending is not None or copies.inflight:
                    with self._lock:
                        self._layer_begins(index)
                if diagnosis.on:
                    diagnosis.sample(f"fwd_start {index}")
        return hook

    def _layer_begins(self, index):
        """Forward reaches layer `index` (or the head: ``len(layers)``); lock held. The pending
        tensor is not the last before backward: stored now, not at the next store (which a
        kept layer would put off until backward). The originals of layers more than
        `copy_window` back go now, the compute stream waiting for their copies: where only
        stores polled, the originals of an offloaded layer followed by kept ones stayed
        until backward, and the activation peak did not move (the H100 run's adaptive row)."""
        state = self._state
        if state.pending is not None and state.pending.group != index:
            e, state.pending = state.pending, None
            self._copies.commit(e)
        self._copies.poll(force_before=index - self._options.copy_window, bound=self._options.inflight_bytes)

    def _make_post_hook(self, index):
        state, copies, diagnosis = self._state, self._copies, self._diagnosis

        def hook(module, args, output):
            if self._group_stack and self._group_stack[-1] == index:
                self._group_stack.pop()
            if self._layer_ctx and self._layer_ctx[-1][0] == index:
                self._layer_ctx.pop()[1].__exit__(None, None, None)
            if state.phase != "forward":
                return
            self.mark("fwd_end", index)
            if index == len(self.layers) - 1:
                self._after_last_layer = True
                if self._options.drain:
                    # memory-tight: the head runs without the layers' activations; the last tensor saved
                    # is stored too (backward reads it first), and every copy is waited for
                    with self._lock:
                        if state.pending is not None:
                            e, state.pending = state.pending, None
                            copies.commit(e)
                        copies.poll(bound=0)
                elif copies.inflight:
                    with self._lock:
                        copies.poll(force_before=index + 1 - self._options.copy_window)
                if diagnosis.on:
                    diagnosis.sample(f"fwd_end {index}", key="forward_end")
            if torch.is_grad_enabled():
                for t in _tensors(output):
                    if t.requires_grad:
                        t.register_hook(self._make_grad_hook(index))
                        break
        return hook

    def _make_grad_hook(self, index):
        fired = []

        def hook(grad):
            if not fired:
                fired.append(True)
                self._backward_starts()
                self.mark("bwd_start", index)
                if self._memory:
                    self._memory_phase_ends(index)
                with self._lock:
                    self._reads.grant_freed()
                    self._reads.prefetch_from(index)
                if self._diagnosis.on:
                    self._diagnosis.sample(f"bwd_start {index}")
            return None
        return hook

    def _memory_phase_ends(self, layer):
        """The allocator's peak (above the step's start) since the last sample, noted as the peak of
        the phase ending now: the forward and the head's backward ends as the last layer's backward
        begins, layer i's backward as layer i - 1's begins (``"end"``: the step's end)."""
        allocator = self.memory_probe or torch.cuda
        peak = allocator.max_memory_allocated() - self._memory_base
        self.memory_marks.append((layer, peak))
        allocator.reset_peak_memory_stats()

    def mark(self, kind, layer):
        """Notes when `kind` happened to `layer` (the policy's profile; nothing where the step is not timed)."""
        if not self._timed:
            return
        if self._cuda_marks:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((kind, layer, ev))
        else:
            self.marks.append((kind, layer, time.perf_counter()))

    def current_group(self, nbytes):
        """The group of a tensor of `nbytes` saved now."""
        if self._group_stack:
            return self._group_stack[-1]
        if self.layers:
            return _HEAD if self._after_last_layer else -1
        group_bytes = self._options.group_bytes
        g = self._cum_bytes // group_bytes if group_bytes else 0
        self._cum_bytes += nbytes
        return g

    def is_parameter(self, t):
        """Whether `t` is a parameter, a buffer, or a view of one."""
        if isinstance(t, torch.nn.Parameter) or (t.is_leaf and t.requires_grad):
            return True
        base = t._base
        if base is not None and (isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad)):
            return True
        return _storage_ptr(t) in self._param_ptrs


def _tensors(output):
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (list, tuple)):
        for o in output:
            yield from _tensors(o)
    elif isinstance(output, dict):
        for o in output.values():
            yield from _tensors(o)
    elif hasattr(output, "to_tuple"):  # transformers' ModelOutput
        yield from _tensors(output.to_tuple())
