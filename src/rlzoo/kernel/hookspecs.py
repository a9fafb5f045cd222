"""The hooks a plugin implements. Every part rlzoo knows, built-in or third-party, arrives here.

A plugin is a module (or any object) with functions decorated by :data:`rlzoo.hookimpl`. Third-party
packages expose it through the ``rlzoo`` entry-point group::

    [project.entry-points.rlzoo]
    my_plugin = "my_package.plugin"

Each ``rlzoo_register_<kind>s`` hook receives ``registry``, a :class:`rlzoo.kernel.registry.Registrar` for
that kind, and calls ``registry.register(name, part, params=..., capabilities=...)`` for each part
it provides. Parts may be passed as ``"module:attr"`` strings so that listing them stays cheap.
``capabilities`` is the kind's typed record (:mod:`rlzoo.kernel.capabilities`) or a mapping of its fields;
a key the record does not declare is an error at registration. The calling conventions of each
kind are the Protocols in :mod:`rlzoo.kernel.protocols`. rlzoo calls every hook through pluggy's hook
caller, so hook wrappers and ``tryfirst`` / ``trylast`` apply.

Hooks are grouped by lifecycle: algorithm parts, reward parts, agent parts, data, execution,
configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from rlzoo.kernel.commands import CliCommand
    from rlzoo.kernel.registry import Registrar

PROJECT = "rlzoo"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# ---------------------------------------------------------------------------------------------
# Algorithm parts
# ---------------------------------------------------------------------------------------------
@hookspec
def rlzoo_register_advantages(registry: Registrar) -> None:
    """Register advantage estimators (kind ``advantage``).

    An advantage estimator turns token-level rewards into advantages and returns. It is called
    as ``fn(inputs: AdvantageInputs, params) -> AdvantageOutput`` where ``inputs`` carries
    ``token_level_rewards [B, T]``, ``response_mask [B, T]`` and, when the part's capabilities ask
    for them, ``group_ids [B]`` (``needs_group``), ``values [B, T]`` (``needs_critic``) and
    ``baseline_rewards [B]`` (``needs_greedy_baseline``). Selected in recipes by
    ``algorithm.advantage.name``.
    """


@hookspec
def rlzoo_register_policy_losses(registry: Registrar) -> None:
    """Register policy losses (kind ``policy_loss``).

    Called as ``fn(inputs: PolicyLossInputs, params) -> PolicyLossOutput``. ``inputs`` carries
    ``log_probs``, ``old_log_probs``, ``advantages``, ``response_mask`` (all ``[B, T]``), optional
    ``rollout_is_weights [B, T]`` and the selected aggregation ``agg`` (a callable
    ``agg(per_token_loss, mask) -> scalar`` already bound to the global token / sequence counts).
    The output is the aggregated scalar loss plus metrics (clip fractions, approximate KL). A loss
    must aggregate through ``inputs.agg``; where its paper fixes an aggregation, it says so in its
    doc and declares it in the ``fixed_aggregation`` capability. Selected by
    ``algorithm.policy_loss.name``.
    """


@hookspec
def rlzoo_register_loss_aggs(registry: Registrar) -> None:
    """Register loss aggregations (kind ``loss_agg``).

    Called as ``fn(per_token_loss [B, T], mask [B, T], ctx: AggContext, params) -> scalar``.
    ``ctx`` carries the global number of response tokens and sequences of the whole mini-batch
    (across micro-batches and data-parallel ranks), so that summing the results over any split
    of the batch gives the full-batch value. Selected by ``algorithm.loss_agg.name``.
    """


@hookspec
def rlzoo_register_kls(registry: Registrar) -> None:
    """Register KL estimators (kind ``kl``).

    Called as ``fn(log_probs [B, T], ref_log_probs [B, T], params) -> kl [B, T]`` (per token, not
    masked). Used both as a loss term (``algorithm.kl_loss``) and as a reward penalty
    (``algorithm.kl_penalty``).
    """


@hookspec
def rlzoo_register_rollout_corrections(registry: Registrar) -> None:
    """Register off-policy corrections (kind ``rollout_correction``).

    Called as ``fn(inputs: CorrectionInputs, params) -> CorrectionOutput`` with trainer-side
    ``old_log_probs`` and the rollout engine's ``rollout_log_probs`` (both ``[B, T]``) and the
    response mask. Returns importance weights ``[B, T]`` (or None), a mask of tokens / sequences
    kept, and mismatch metrics. Selected by ``algorithm.rollout_correction.name``.
    """


@hookspec
def rlzoo_register_sample_filters(registry: Registrar) -> None:
    """Register sample filters (kind ``sample_filter``).

    Called as ``fn(rewards [N], group_ids [N], params) -> keep [N] (bool)``. Filters decide per
    group; a filter with the ``refills`` capability asks the runner to generate more groups
    until the batch is full. Selected by ``algorithm.sample_filter.name``.
    """


# ---------------------------------------------------------------------------------------------
# Reward parts
# ---------------------------------------------------------------------------------------------
@hookspec
def rlzoo_register_scorers(registry: Registrar) -> None:
    """Register scorers (kind ``scorer``).

    Called as ``fn(response: str, ground_truth, data_source: str, extra_info: dict, params)`` and
    returns a float score or a dict with at least ``score`` (other keys become metrics). A scorer
    never ``eval``s model output. With the ``batched`` capability it receives lists instead.
    Selected by ``reward.scorer.name`` (and per data source by ``reward.scorers.<source>``).
    """


@hookspec
def rlzoo_register_reward_managers(registry: Registrar) -> None:
    """Register reward managers (kind ``reward_manager``).

    A reward manager is a factory ``factory(params, scorer: ScorerFn) -> RewardManager`` whose
    instances are called with a list of :class:`rlzoo.kernel.protocols.RewardItem` and return one
    :class:`rlzoo.kernel.protocols.RewardResult` per item. A scorer that raises or returns NaN must
    yield a failed result, not an exception. Selected by ``reward.manager.name``.
    """


# ---------------------------------------------------------------------------------------------
# Agent parts (multi-turn rollouts)
# ---------------------------------------------------------------------------------------------
@hookspec
def rlzoo_register_environments(registry: Registrar) -> None:
    """Register environments (kind ``environment``): what a model acts in over several turns.

    An environment is a factory ``factory(params) -> Environment`` called once per trajectory (see
    :class:`rlzoo.kernel.protocols.Environment`). ``env.reset(row)`` receives the dataset row and returns
    an :class:`rlzoo.kernel.protocols.EnvStep` whose ``messages`` are the first observation (the chat
    messages the prompt is rendered from); ``env.step(turn)`` receives the model's turn (an
    :class:`rlzoo.kernel.protocols.AgentTurn`: its text, read-only) and returns the next observation, an
    optional per-turn reward, ``done`` and info. Either method may be ``async``: the multi-turn
    rollout awaits it off the engine (a sync one on a thread of its own, abandoned past
    ``env_timeout_s``), so a slow environment holds only its own trajectory; what it returns is
    checked (text messages, a finite reward) and a bad value fails that trajectory only.
    ``env.tools()`` lists the :class:`rlzoo.kernel.protocols.Tool` objects it offers the model. Selected
    by ``rollout.environment``; its limits are ``rollout.multi_turn``.
    """


@hookspec
def rlzoo_register_tools(registry: Registrar) -> None:
    """Register tools (kind ``tool``): functions a model calls from its turn.

    A tool is a factory ``factory(params) -> Tool`` (see :class:`rlzoo.kernel.protocols.Tool`): it has a
    ``name``, a ``description``, a JSON schema of its arguments (``parameters``), a per-call
    ``timeout_s`` and ``call(arguments) -> str`` (or an ``async`` one). A call that raises, times
    out, returns no text or gets arguments its schema refuses becomes an error observation the
    model reads, and is counted (``agent/tool_errors``); one that raises a ``BaseException``
    (``SystemExit``) fails its trajectory. A sync call past ``timeout_s`` is abandoned, never waited
    for. Selected by ``rollout.tools`` (a list), on top of
    the tools the environment offers.
    """


@hookspec
def rlzoo_register_agents(registry: Registrar) -> None:
    """Register agents (kind ``agent``): a user's own agent program, trained unchanged.

    An agent is a factory ``factory(params) -> Agent`` (see :class:`rlzoo.kernel.protocols.Agent`)
    called once per episode. ``agent.run(client, row)`` (sync or ``async``) plays one episode of a
    dataset row: it talks to the run's OpenAI-compatible gateway at ``client.base_url`` with
    ``client.api_key`` and ``client.model`` and returns an :class:`rlzoo.kernel.protocols.AgentResult`
    (a reward, or a final answer the recipe's scorer judges; an environment set beside the agent,
    ``rollout.environment``, judges its episodes instead, per-token rewards included). Every call it makes is recorded as
    the ids the engine sampled; calls that extend the previous call's ids merge into one exact
    trajectory (:mod:`rlzoo.gateway`). Selected by ``rollout.agent``; its limits are
    ``rollout.gateway``. The built-in ``command`` agent runs any program (``OPENAI_BASE_URL`` /
    ``OPENAI_API_KEY`` in its environment, the row as JSON on stdin, a JSON result on stdout).
    """


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
@hookspec
def rlzoo_register_datasets(registry: Registrar) -> None:
    """Register dataset preparers (kind ``dataset``).

    A preparer is ``fn(out_dir: Path, params) -> dict[str, Path]`` that loads a dataset (hub
    name or local path, through the ``datasets`` library) and writes parquet files in rlzoo's
    schema (see :mod:`rlzoo.data.schema`), returning the split names and the files written. Used by
    ``rlzoo prepare NAME`` and by recipes through ``data.prepare``.
    """


# ---------------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------------
@hookspec
def rlzoo_register_train_backends(registry: Registrar) -> None:
    """Register training backends (kind ``train_backend``).

    A training backend is a factory ``factory(params, spec: TrainSpec) -> TrainBackend`` (see
    :class:`rlzoo.kernel.protocols.TrainBackend`): it owns the actor, and where asked the critic and
    the frozen reference model; computes log-probs, entropy and values; runs the policy and
    value updates; exports weights for the rollout backend; saves and resumes checkpoints.
    Heavy imports happen inside the factory. Selected by ``trainer.backend.name``.
    """


@hookspec
def rlzoo_register_rollout_backends(registry: Registrar) -> None:
    """Register rollout backends (kind ``rollout_backend``).

    A rollout backend is a factory ``factory(params, spec: RolloutSpec) -> RolloutBackend``
    (see :class:`rlzoo.kernel.protocols.RolloutBackend`): it generates ``n`` responses per prompt with
    per-token log-probs, streams finished samples, can pause and resume in-flight requests
    (``supports_partial_rollout``), and loads new weights. Selected by ``rollout.backend.name``.
    """


@hookspec
def rlzoo_register_runners(registry: Registrar) -> None:
    """Register runners (kind ``runner``).

    A runner is a batch source: the part registers a factory ``factory(params, session) ->
    BatchSource`` (a class will do) and the core's one loop (:class:`rlzoo.train.loop.TrainLoop`) owns
    everything else: validation, checkpoints (one payload), the weight-push cadence, metrics,
    export and resume. A source (:class:`rlzoo.train.loop.BatchSource`) has five methods:
    ``resume(state)``, ``next_batch(step, timer) -> Batch | None``, ``push_weights(timer)``,
    ``step_done(batch) -> metrics`` and ``state_dict()``; one that generates while the trainer
    trains also has ``hold()`` and ``close(exc)`` (:class:`rlzoo.train.loop.Background`). The
    ``session`` (:class:`rlzoo.train.session.Session`) gives the step plan (``session.plan``), the
    rollout (``session.rollout``), the helpers to draw prompts, generate, score and push weights
    (``make_loader``, ``train_requests``, ``score``, ``keep``, ``sync_weights``), ``pad_token_id``, and
    typed records built from the recipe once (``session.data``, ``session.schedule``,
    ``session.sampling``, ``session.reward``, ``session.backends``); it holds no recipe. Params may declare
    ``step_plan(cfg)`` (:class:`rlzoo.kernel.protocols.PlansSteps`) and ``check(cfg)``
    (:class:`rlzoo.kernel.protocols.ChecksRecipe`). A plugin's whole runner, e.g.::

        class GenerateOnce:
            def __init__(self, params, session):
                self.s, self.loader = session, session.make_loader(session.plan.prompts_per_step)
            def resume(self, state):
                self.loader.load_state_dict(state["loader"])
            def next_batch(self, step, timer):
                with timer.wait("gen"):
                    samples = self.s.rollout.generate(self.s.train_requests(next(self.loader), step, 1))
                return samples_to_batch(samples, self.s.score(samples), self.s.pad_token_id)
            def push_weights(self, timer):
                return self.s.sync_weights()
            def step_done(self, batch):
                return {}
            def state_dict(self):
                return {"loader": self.loader.state_dict()}

        registry.register("generate_once", GenerateOnce, params=GenerateOnceParams)

    Selected by ``runner.name``.
    """


@hookspec
def rlzoo_register_loggers(registry: Registrar) -> None:
    """Register metric loggers (kind ``logger``): where a run's metrics go.

    A logger is a factory ``factory(params, context: LoggerContext) -> MetricSink`` (see
    :mod:`rlzoo.report.metrics`): ``context`` carries the run directory, the run's name and id, its
    resolved config, plugin versions and whether the run resumes; the sink's ``log(step, record,
    advance=...)`` receives every step's record (``step``, ``time`` and float metrics, the same
    object that goes to ``metrics.jsonl``) and ``close()`` ends the run. A tracker keeps what it
    needs to continue the same tracker run on resume in ``RUN_DIR/trackers.json``
    (:func:`rlzoo.report.metrics.tracker_state`). A logger that needs an optional package declares it in
    the ``requires`` and ``extra`` capabilities, so ``rlzoo validate`` rejects it when missing.
    Selected by ``run.loggers`` (a list: ``[console, jsonl, wandb]``).
    """


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@hookspec
def rlzoo_recipe_search_paths() -> list[str]:  # type: ignore[empty-body]
    """Return directories that hold recipes (Hydra YAML) and config groups a plugin ships.

    Paths are searched after the user's working directory and before rlzoo's own ``recipes``,
    so a plugin can add recipes (``rlzoo train recipe=my_recipe``) and config groups.
    """


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
@hookspec
def rlzoo_cli_commands() -> list[CliCommand]:  # type: ignore[empty-body]
    """Return subcommands a plugin adds to the ``rlzoo`` command line (:class:`rlzoo.kernel.commands.CliCommand`).

    Each command names itself, says what it does in one line, declares its arguments on the
    ``argparse`` parser rlzoo gives it, and runs with the parsed namespace, returning the exit code.
    Its module must import cheaply: the command line is built from every plugin's commands, so
    heavy imports belong inside ``run``. A name taken by rlzoo's own commands or another plugin's is
    an error naming both. ``rlzoo from-verl`` arrives this way (``plugins/rlzoo-from-verl``).
    """
