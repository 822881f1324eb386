"""What a feature of the seam is: the ``Feature`` base, the context it is made from, its table row.

A feature (alignment, phase times, the PNG writer, metrics.jsonl, resume, ...) is a subclass of
``Feature`` that overrides the events it acts on; every other event is the base's no-op.  The
seam (dancegrpo_port/hooks.py) dispatches each event to every installed feature, in call order.
The events are the base's public methods (``EVENTS``); a feature class whose own public
method is none of them (a misspelt event, or a helper that should be private: ``_name``)
is refused when it is installed, in one line naming the class and the method, before the
run does anything: a misspelt event would otherwise never be called, silently.

Three kinds of event, as hooks.py calls them:

- notices (``step_begin``, ``sampled``, ...): every feature's method is called; no result;
- contexts (``sampling``, ``model_call``, ``decoding``, ``rewarding``, ``training``): every
  feature's context manager is entered around the trainer's code (the base's does nothing);
- answers (``initial_latents``, ``sde_noise``, ``timestep_perms``, ``selection_order``,
  ``condition_generator``: the noise source; ``sde_step``, ``trained_order``,
  ``trained_timesteps``: the SDE window): the first feature that returns something other than
  None answers; when none does, the draw or the choice is upstream's, from the row that gives it
  (``FeatureRow.upstream_answers``).  ``checkpoint_load`` passes the step to start after from feature to feature.

A row of the seam's table (``hooks.FEATURES``) says how to make one feature for a run: its
trainer flags (``add_arguments(parser)``), its one-line check of them
(``argument_problem(args, environ)``), and ``create(context)``; and whether a bench step
(dancegrpo_npu bench) takes part in it.  Self-contained: the standard library only.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

# The bench's use of a row (FeatureRow.bench): not in a bench step; in every bench step; only
# in its timed steps (what writes the step's figures: its warm-up steps are not logged).
BENCH_NONE, BENCH_EVERY_STEP, BENCH_TIMED_STEPS = None, "every step", "timed steps"


class FeatureError(TypeError):
    """A feature that cannot be installed: the message is one line naming it."""


class Feature:
    """The base of every feature: one no-op method per event of the seam (hooks.py calls them
    in this order in a run; see its module doc).  Override the events the feature acts on."""

    # -------------------------------------------------------------- the run

    def resumed(self, step: int) -> None:
        """A resume continues after ``step``: forget what the run wrote after it."""

    def checkpoint_load(self, init_steps: int, **state) -> int:
        """At upstream's resume point: the step the run starts after."""
        return init_steps

    def checkpoint_save(self, step: int, **state) -> None:
        """After a step's step_end, with the training state."""

    def data_pass_begin(self) -> None:
        """Before a pass over the data makes its DataLoader iterator (trainers of several passes)."""

    def trained_model(self, model) -> None:
        """After the training loop, with the trained model (a collective under FSDP)."""

    def run_end(self) -> None:
        """The end of main()."""

    # -------------------------------------------------------------- a step

    def step_begin(self, step: int) -> None:
        """Before the step's data and rollout."""

    def step_end(self, step: int, figures: dict) -> None:
        """After the step and its time: add to ``figures`` (metrics.jsonl writes them)."""

    # -------------------------------------------------------------- the rollout

    def rollout_begin(self, num_samples: int, latent_shape, sampling_steps: int, same_noise: bool,
                      sde_shape=None) -> None:
        """Before the step's rollout."""

    def rollout_batch(self, batch_idx) -> None:
        """The samples (indices into the step's) of the next rollout batch."""

    def initial_latents(self, shape, device, dtype):
        """The noise source's initial latents, or None: not this feature's to answer."""
        return None

    def sde_noise(self, like, index: int):
        """The noise source's SDE noise of sampling step ``index``, or None."""
        return None

    def sde_step(self, index: int):
        """Whether sampling step ``index`` is an SDE step (True) or the ODE (False), or None:
        not this feature's to answer (upstream's: every step an SDE step)."""
        return None

    def sampling(self):
        """Around a rollout batch's sampling loop."""
        return nullcontext()

    def model_call(self, name: str, module):
        """Around a call of one of the step's models."""
        return nullcontext()

    def sampled(self, latents, log_probs) -> None:
        """A rollout batch's latents and log-probs."""

    def decoding(self, vae):
        """Around the VAE decode of a rollout batch."""
        return nullcontext()

    def decoded(self, images, batch_idx, name: str) -> None:
        """A batch's decoded images (PIL), one per sample of ``batch_idx``."""

    def image_file(self, path: str) -> None:
        """A sample's PNG is about to be read back."""

    def rewarding(self, model):
        """Around the reward of a rollout batch."""
        return nullcontext()

    def conditioning(self, model):
        """Around the step's conditioning made by another model (SkyReels-I2V's first frame)."""
        return nullcontext()

    # -------------------------------------------------------------- the update

    def rewards_gathered(self, rewards) -> None:
        """The step's rewards gathered from every rank (upstream's ``gathered_reward``, the same
        on every rank), before the advantages are computed from them."""

    def advantages(self, rewards, advantages) -> None:
        """The step's rewards and advantages."""

    def timestep_perms(self, batch_size: int, n: int):
        """The noise source's timestep permutations, or None."""
        return None

    def trained_order(self, perms):
        """The timestep permutations in the order the training loop takes them, or None."""
        return None

    def trained_timesteps(self, count: int):
        """The timesteps each sample trains (upstream's ``count``), or None."""
        return None

    def selection_order(self, n: int, device):
        """The noise source's shuffle of the samples best-of-n keeps, or None."""
        return None

    def condition_generator(self):
        """The generator a conditioning model draws with, or None (the device's, as upstream)."""
        return None

    def training(self):
        """Around the whole training loop of the step."""
        return nullcontext()

    def trained_pair(self, new_log_prob, old_log_prob, ratio, loss) -> None:
        """One trained (sample, timestep)."""

    def update(self, grad_norm) -> None:
        """Before an optimizer step, with its clipped gradient norm."""


EVENTS = frozenset(name for name, value in vars(Feature).items() if callable(value) and not name.startswith("_"))
# the events whose first answer (not None) is the result; upstream's draw when none answers
ANSWERS = ("initial_latents", "sde_noise", "timestep_perms", "selection_order", "condition_generator", "sde_step",
           "trained_order", "trained_timesteps")
# the events that are context managers, entered for every feature
CONTEXTS = ("sampling", "model_call", "decoding", "rewarding", "conditioning", "training")


def check_feature(feature) -> None:
    """Refuse (FeatureError, one line) what is no Feature, or a feature class with a public
    method that is no event: the seam would never call it."""
    cls = type(feature)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if not isinstance(feature, Feature):
        raise FeatureError(f"{name} is not a dancegrpo_port.feature.Feature: a feature of the seam subclasses it")
    for klass in cls.__mro__:
        if klass is Feature or klass is object:
            continue
        for attr, value in vars(klass).items():
            if attr.startswith("_") or attr in EVENTS:
                continue
            if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
                raise FeatureError(
                    f"{name}.{attr} is no event of the seam (dancegrpo_port/feature.py Feature's methods): "
                    f"a misspelt event is never called; rename it to the event, or to _{attr} if it is a helper")


@dataclass
class Context:
    """What a run's features are made from: the trainer's arguments (parsed), this process's
    rank, the world size and the device; and ``shared``: what several features of one run use
    (the alignment run, whose generator Resume saves; the phase timer), made once by the first
    that asks (``get``), or given by the caller (the bench gives its own)."""

    args: Any
    rank: int = 0
    world_size: int = 1
    device: Any = None
    shared: dict = field(default_factory=dict)

    def get(self, key: str, make: Callable[[], Any]):
        if key not in self.shared:
            self.shared[key] = make()
        return self.shared[key]


@dataclass(frozen=True, kw_only=True)
class FeatureRow:
    """One feature in the seam's table (hooks.FEATURES): its name, its trainer flags, their
    check (one line, or None), how a run makes it, whether a bench step has it, and, for a
    feature that answers events (``ANSWERS``), what answers them as upstream does where no
    installed feature does (before ``run_start``)."""

    name: str
    create: Callable[[Context], Feature]
    add_arguments: Callable[[Any], None] | None = None
    argument_problem: Callable[[Any, Any], str | None] | None = None  # (args, environ)
    bench: str | None = BENCH_NONE
    upstream_answers: Any = None  # an object with the ANSWERS methods: upstream's draws
