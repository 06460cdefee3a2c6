"""What a run needs besides the plan: the model actually trained and the run settings a user
chooses (`RunConfig`), and the job every worker reads (`Job`: plan, settings, cluster).

Test-only failure hooks are not settings: they live in `runtime.failure`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from planner.base import MAX_SEED, Frozen
from planner.hardware import Cluster
from planner.kinds import AnyPlan, kind_of
from planner.problem import Problem
from planner.workload import ModelSpec, ScheduleName

BYTE_VOCAB = 256
# the multiple the refusal of an unsplittable vocabulary suggests padding to: 64 covers every TP size
# up to 64, as the padded vocabularies of public models do (GPT-NeoX 50,432; Qwen2 151,936)
VOCAB_PAD_MULTIPLE = 64
DataName = Literal["synthetic", "corpus", "text"]  # text: a tokenized corpus (token_file)
SaveDtype = Literal["float32", "bfloat16", "float16"]
# How a rank waits for an operation on CPU (runtime.communication.comm_types.Waiter): "auto" polls while the
# host's ranks fit its cores; "asleep" never polls (cores shared with other work on purpose).
WaitName = Literal["auto", "asleep"]
Backend = Literal["gloo", "nccl"]
# docs/models-and-data.md §12: fp32 (weights are the master copy) | bf16 (bf16 weights, gradients and
# activations; fp32 master weights and Adam moments)
Precision = Literal["fp32", "bf16"]
# the longest wait on a peer (and on the rendezvous) a run may set: a day. Finite, because the job
# file is JSON (inf would be written as null, which no worker reads back) and torchrun's
# rendezvous bound is whole seconds.
MAX_TIMEOUT_S = 24 * 3600.0


class RunConfig(Frozen):
    # every number finite: an inf or nan setting (timeout, lr, clip) is refused where it is set, not
    # written into the job file as null for every worker to fail on
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    model: ModelSpec = Field(description="the model actually trained")
    seq_len: int = Field(ge=1, description="tokens per sequence")
    micro_batch: int = Field(ge=1, description="b, sequences per micro-batch")
    steps: int = Field(default=3, ge=1, description="optimizer steps")
    schedule: ScheduleName = Field(default="1f1b", description="pipeline schedule (planner.schedules); "
                                   "make_job takes the problem's training.schedule")
    recompute: bool = Field(default=False, description="full activation recomputation")
    data: DataName = Field(default="synthetic", description="token source")
    lr: float = Field(default=1e-3, ge=0, description="AdamW learning rate (0: the weights stay as they are)")
    weight_decay: float = Field(default=0.01, ge=0, description="AdamW weight decay")
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="seeds weights and data")
    backend: Backend = Field(default="gloo", description="torch.distributed backend")
    timeout_s: float = Field(default=60, gt=0, le=MAX_TIMEOUT_S, description="bound on any collective's wait "
                             "and on the rendezvous, seconds (at most a day)")
    wait: WaitName = Field(default="auto", description="CPU waits: auto (awake while ranks fit the cores) | asleep")
    check_replicas: bool = Field(default=True, description="check replica equality after the last step")
    out_dir: str = Field(default="", description="folder for metrics and parameter shards")
    dump_params: bool = Field(default=False, description="write every rank's shards to out_dir")
    checkpoint_dir: str = Field(default="", description="folder of plan-independent checkpoints (runtime.checkpoints.manifest)")
    save_every: int = Field(default=0, ge=0, description="save a checkpoint every N steps (0: never)")
    resume_from: str = Field(default="", description="a verified checkpoint folder to start from")
    # docs/models-and-data.md §12: Hugging Face weights in and out, tokenized text
    init_from: str = Field(default="", description="a Hugging Face folder whose safetensors the weights start from")
    save_hf: str = Field(default="", description="folder to write the trained model to, Hugging Face layout")
    save_dtype: SaveDtype = Field(default="float32", description="dtype of the tensors save_hf writes")
    token_file: str = Field(default="", description="data 'text': the token stream's cache (runtime.model.text)")
    eval_token_file: str = Field(default="", description="a held-out token stream's cache (eval loss)")
    eval_every: int = Field(default=0, ge=0, description="an eval loss every N steps (0: never)")
    # issue 31: the runtime as the cost model prices it (§3.5 sequence parallelism, §11 ZeRO-1, §12 precision)
    precision: Precision = Field(default="fp32", description="fp32 | bf16 (fp32 master weights and moments)")
    sequence_parallel: bool = Field(default=False, description="TP stages split norms, residuals and the "
                                                               "kept layer input over the sequence (§3.5)")
    zero_stage: int = Field(default=0, ge=0, le=1, description="1: a chunk's D owners shard its optimizer "
                                                               "state (§11; D ≥ 2 pipelines)")
    clip_grad: float | None = Field(default=None, gt=0, description="clip the gradients' global norm to this "
                                    "before each optimizer step, as torch's clip_grad_norm_ (None: never)")
    log_every: int = Field(default=1, ge=1, description="rank 0 prints every N-th step's line (and always the "
                           "first, the last and every eval step)")

    @property
    def data_id(self) -> str:
        """What fixes the tokens read: the source's name, a token stream's cache key."""
        return f"text:{Path(self.token_file).stem}" if self.data == "text" else self.data


class Job(Frozen):
    """Everything a worker process reads: the plan, the run settings and, when the job was
    made for a problem, the cluster (machines and vendors of the plan's devices)."""

    plan: AnyPlan = Field(description="a plan of any kind (told apart by its format tag)")
    config: RunConfig
    cluster: Cluster | None = Field(default=None, description="the problem's cluster (taken from `problem` "
                                    "where the job has one); None: unknown")
    problem_hash: str = Field(default="", description="sha256 of the problem (checkpoint manifests)")
    # a --torchrun run has no launcher to gather it: rank 0 writes the run log from the job alone
    problem: Problem | None = Field(default=None, description="the problem the job was made for, which its "
                                    "run log names and prices (runtime.metrics.runlog); None: unknown")

    @model_validator(mode="before")
    @classmethod
    def _cluster_from_problem(cls, data: Any) -> Any:
        """A job file carries the cluster once, inside its problem (a 10^5-device cluster is
        megabytes): read back, the job's cluster is its problem's, the same object."""
        if isinstance(data, dict) and data.get("cluster") is None and data.get("problem") is not None:
            problem = data["problem"]
            problem = problem if isinstance(problem, Problem) else Problem.model_validate(problem)
            data = {**data, "problem": problem, "cluster": problem.cluster}
        return data

    @model_validator(mode="after")
    def _one_cluster(self) -> Job:
        """A job made for a problem runs on that problem's cluster, no other."""
        if self.problem is not None and self.cluster is not None and self.cluster is not self.problem.cluster \
                and self.cluster != self.problem.cluster:
            raise ValueError(f"cluster: the job's cluster {self.cluster.name!r} is not its problem's "
                             f"({self.problem.cluster.name!r})")
        return self

    @model_serializer(mode="wrap")
    def _cluster_once(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The cluster is written once: inside the problem where the job has one."""
        data = handler(self)
        if self.problem is not None:
            data["cluster"] = None
        return data

    @property
    def kind(self) -> str:
        """The plan's kind (planner.kinds): picks the runtime (runtime.kinds)."""
        return kind_of(self.plan).name


def check_model_fits(spec: ModelSpec, tp_sizes: list[int]) -> None:
    """Every TP size must split heads, kv heads, ffn and vocabulary into equal blocks. The runtime
    does not pad a vocabulary as Megatron does (the plan-independent checkpoints, the DP sync's
    chunks and ZeRO-1's buckets are all cut from the model's own shapes), so a vocabulary that
    does not split is refused with the remedy: padding it in the model folder."""
    for t in sorted(set(tp_sizes)):
        misfits = spec.tp_misfits(t)
        if misfits:
            raise ValueError(f"TP size {t} does not divide the model's {misfits[0]} of model {spec.name!r}: "
                             + (_vocab_remedy(spec, t) if misfits[0].startswith("vocab") else "")
                             + "use a plan whose TP sizes divide it")


def _vocab_remedy(spec: ModelSpec, t: int) -> str:
    """How to make a vocabulary split into t equal blocks: pad it, as Hugging Face does."""
    padded = -(-spec.vocab // VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE
    return (f"pad the vocabulary to a multiple of {t} first (in transformers: "
            f"model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of={VOCAB_PAD_MULTIPLE}), then "
            f"model.save_pretrained(FOLDER): vocab {spec.vocab} becomes {padded}), or ")


def check_sequence_parallel(seq_len: int, sequence_parallel: bool, tp_sizes: list[int]) -> None:
    """Sequence parallelism splits every sequence over the TP group: each TP size must divide s
    (checked before any process starts, as the ranks check it again)."""
    misfit = next((t for t in sorted(set(tp_sizes)) if sequence_parallel and seq_len % t), None)
    if misfit:
        raise ValueError(f"sequence parallelism: TP size {misfit} does not divide seq_len {seq_len}; "
                         f"use a seq_len that {misfit} divides, or turn sequence_parallel off")
