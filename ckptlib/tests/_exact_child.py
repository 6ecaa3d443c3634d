"""Child process of the exactness suite: one training path, a checkpoint every step.

    python -m ckptlib.tests._exact_child PATH OUT REFS_DIR READY_AT SELF_SIGNAL_AT MAX_STEPS [SAVE_TOTAL_LIMIT]

PATH is ``plain`` (``ckptlib.CheckpointEngine``), ``accelerate`` (the same on objects from
``Accelerator.prepare``), ``trainer`` (``DecoratedCheckpointing`` on a Hugging Face Trainer) or
``deepspeed`` (a DeepSpeed ZeRO-1 engine on the CPU, ``ckptlib.deepspeed.use_ckptlib``).

Every path trains a small model with BatchNorm statistics and an EMA copy, with Adam stepping
parameters one by one (``foreach=False``: most of a step is inside ``optimizer.step()``) and a
tensor learning rate. Right before each checkpoint the child writes a deep copy of what the
checkpoint must hold to ``REFS_DIR/<step>.pt`` (written before the save, so a SIGKILL leaves
every committed step's reference whole). After each save, before the next step, it updates the
EMA in place, changes the tensor learning rate in place (a scheduler's way) and sleeps a random
moment. It prints ``ready`` after step READY_AT. With SELF_SIGNAL_AT=k it sends itself SIGTERM a
few milliseconds into ``optimizer.step()`` of step k and records in ``REFS_DIR/landed`` where the
handler interrupted; otherwise the parent signals (or kills) it.
"""

from __future__ import annotations

import copy
import importlib
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

import ckptlib
from ckptlib.deepspeed import commit_pending, use_ckptlib
from ckptlib.tests import helpers
from ckptlib.tests.helpers import clone_state

PATH, OUT, REFS = sys.argv[1], sys.argv[2], Path(sys.argv[3])
READY_AT, SELF_SIGNAL_AT, MAX_STEPS = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
SAVE_TOTAL_LIMIT = int(sys.argv[7]) if len(sys.argv) > 7 else None
RNG = random.Random(os.getpid())
WIDTH = 16


class Net(torch.nn.Module):
    """A small net with BatchNorm and many small parameters (Adam's per-parameter loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(WIDTH, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        self.extra = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(8, 8)) for _ in range(200)])

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = self.body(inputs).pow(2).mean() + torch.stack([p.sum() for p in self.extra]).sum() * 1e-3
        return loss


def record(step: int, expected: dict[str, Any]) -> None:
    torch.save(clone_state(expected), REFS / f"{step}.pt.tmp")
    os.replace(REFS / f"{step}.pt.tmp", REFS / f"{step}.pt")


def after_save(ema: torch.nn.Module, live: torch.nn.Module, lr: torch.Tensor) -> None:
    """What users write after ``save()`` and before the next step: all of it changes in place."""
    with torch.no_grad():
        for averaged, current in zip(ema.parameters(), live.parameters(), strict=True):
            averaged.mul_(0.9).add_(current, alpha=0.1)
        for kept, current_buffer in zip(ema.buffers(), live.buffers(), strict=True):
            kept.copy_(current_buffer)
        lr.mul_(0.99)
    if RNG.random() < 0.5:
        time.sleep(RNG.uniform(0.0, 0.02))


def arm_self_signal(optimizer: torch.optim.Optimizer, current_step: Any) -> None:
    """SIGTERM inside ``optimizer.step()`` of step SELF_SIGNAL_AT (``helpers.arm_self_signal``)."""
    helpers.arm_self_signal(optimizer, current_step, at=SELF_SIGNAL_AT, landed_file=REFS / "landed", rng=RNG)


def ready(step: int) -> None:
    if step == READY_AT:
        print("ready", flush=True)


def optimizer_for(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    optimizer = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01), foreach=False)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)


def run_plain(accelerate: bool) -> None:
    torch.manual_seed(0)
    model = Net()
    ema = copy.deepcopy(model).requires_grad_(False)
    optimizer: Any  # accelerate's AcceleratedOptimizer once prepared (accelerate ships no types)
    optimizer, scheduler = optimizer_for(model)
    lr = optimizer.param_groups[0]["lr"]
    if accelerate:
        from accelerate import Accelerator  # lazy: this path only (optional)

        accelerator = Accelerator(cpu=True)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        backward = accelerator.backward
        unwrapped = accelerator.unwrap_model(model)
    else:
        backward, unwrapped = (lambda loss: loss.backward()), model
    step = 0
    state = {"model": unwrapped, "optimizer": optimizer, "scheduler": scheduler, "ema": ema}
    engine = ckptlib.CheckpointEngine(output_dir=OUT, host_cache_size=RNG.choice([0.002, 0.05]), final_state=lambda: (state, step), grace_period_s=30)
    arm_self_signal(optimizer.optimizer if accelerate else optimizer, lambda: step)
    while step < MAX_STEPS:
        backward(model(torch.randn(8, WIDTH)))
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        step += 1
        record(step, {key: value.state_dict() for key, value in state.items()})
        engine.save(state, step=step)
        after_save(ema, unwrapped, lr)
        ready(step)
    engine.shutdown()


def run_trainer() -> None:
    # Lazy: this path only (transformers is optional).
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    class Model(torch.nn.Module):
        """A tiny Llama (from a config) behind a BatchNorm on its embeddings, with an EMA copy
        of its head kept as buffers (not trained: the Trainer's optimizer never sees them)."""

        def __init__(self) -> None:
            super().__init__()
            config = LlamaConfig(
                vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=2, max_position_embeddings=32,
            )  # fmt: skip
            self.llama = LlamaForCausalLM(config)
            self.norm = torch.nn.BatchNorm1d(16)
            self.extra = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(8, 8)) for _ in range(100)])
            self.ema = torch.nn.Module()
            self.ema.register_buffer("head", self.llama.lm_head.weight.detach().clone())

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            embeds = self.llama.model.embed_tokens(input_ids)
            embeds = self.norm(embeds.transpose(1, 2)).transpose(1, 2)
            loss = self.llama(inputs_embeds=embeds, labels=labels).loss
            return {"loss": loss + torch.stack([p.sum() for p in self.extra]).sum() * 1e-3}

    class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __len__(self) -> int:
            return 4096

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            ids = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(index))
            return {"input_ids": ids, "labels": ids}

    torch.manual_seed(0)
    model = Model()
    optimizer, scheduler = optimizer_for(model)
    lr = optimizer.param_groups[0]["lr"]
    args = TrainingArguments(
        output_dir=OUT, per_device_train_batch_size=4, max_steps=MAX_STEPS, save_steps=1, report_to="none",
        use_cpu=True, logging_steps=1000, disable_tqdm=True, save_total_limit=SAVE_TOTAL_LIMIT,
        remove_unused_columns=False, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), optimizers=(optimizer, scheduler))

    class AfterSave(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step:  # the previous step's save is done: change state in place
                with torch.no_grad():
                    model.ema.get_buffer("head").mul_(0.9).add_(model.llama.lm_head.weight, alpha=0.1)
                    lr.mul_(0.99)
                if RNG.random() < 0.5:
                    time.sleep(RNG.uniform(0.0, 0.02))

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            ready(state.global_step)

    trainer.add_callback(AfterSave())
    # The documentation's import, from the vendor directory on PYTHONPATH (this path only).
    from datastates.llm import DecoratedCheckpointing

    DecoratedCheckpointing(runtime_config={"host_cache_size": RNG.choice([0.002, 0.05]), "trainer": trainer}, rank=-1)
    decorated = trainer._save_checkpoint

    def save_checkpoint(model_: Any, trial: Any) -> None:
        state = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
        record(trainer.state.global_step, {key: value.state_dict() for key, value in state.items()})
        decorated(model_, trial)

    # This instance's save replaced, as DecoratedCheckpointing replaces it.
    trainer._save_checkpoint = save_checkpoint  # type: ignore[method-assign, assignment]
    arm_self_signal(optimizer, lambda: trainer.state.global_step)
    trainer.train(resume_from_checkpoint=os.getenv("CKPT_LAST_STEP") is not None)
    print("trained", trainer.state.global_step, flush=True)


def run_deepspeed() -> None:
    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", DS_ACCELERATOR="cpu",
        MASTER_PORT=os.environ.get("DS_TEST_PORT", "29571"),
    )  # fmt: skip
    import deepspeed  # lazy: this path only (optional), and after its environment above

    # One process on gloo needs no shared-memory collective (its JIT build needs a compiler).
    comm_torch: Any = importlib.import_module("deepspeed.comm.torch")  # DeepSpeed ships no types
    comm_torch.build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")

    torch.manual_seed(0)
    model = Net()
    ema = copy.deepcopy(model).requires_grad_(False)
    optimizer, scheduler = optimizer_for(model)
    lr = optimizer.param_groups[0]["lr"]
    config = {"train_batch_size": 8, "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True}
    ds, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config)
    step = 0
    saved: set[int] = set()

    def save() -> None:
        record(step, {"module": ds.module.state_dict(), "ema": ema.state_dict(), "lr_scheduler": scheduler.state_dict(),
                      "optimizer": ds.optimizer.state_dict()})  # fmt: skip
        ds.save_checkpoint(OUT, tag=f"global_step{step}", client_state={"ema": ema.state_dict()})
        saved.add(step)

    def final_save() -> None:
        if step not in saved:
            save()
        commit_pending(ds)

    # The final checkpoint on SIGTERM, at the next safe point: the last step saved and committed.
    engine = ckptlib.CheckpointEngine(host_cache_size=RNG.choice([0.002, 0.05]), grace_period_s=30)
    engine.final_save = final_save
    use_ckptlib(ds, engine=engine)
    arm_self_signal(optimizer, lambda: step)
    while step < MAX_STEPS:
        ds.backward(ds(torch.randn(8, WIDTH)))
        ds.step()
        step += 1
        save()
        after_save(ema, ds.module, lr)
        ready(step)
    final_save()
    engine.shutdown()


if __name__ == "__main__":
    REFS.mkdir(parents=True, exist_ok=True)
    if PATH == "trainer":
        run_trainer()
    elif PATH == "deepspeed":
        run_deepspeed()
    else:
        run_plain(accelerate=PATH == "accelerate")
