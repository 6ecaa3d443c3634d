"""Child process of the DeepSpeed Trainer test: a tiny Llama under Trainer + DeepSpeed (ZeRO 1) on
the CPU, decorated as the documentation's script does. argv: output dir, max_steps."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

os.environ.update(
    RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("DS_TEST_PORT", "29561"),
    DS_ACCELERATOR="cpu", ACCELERATE_USE_DEEPSPEED="true",
)  # fmt: skip

import torch

# One process on gloo needs no shared-memory collective (its JIT build needs a compiler).
comm_torch: Any = importlib.import_module("deepspeed.comm.torch")  # DeepSpeed ships no types
comm_torch.build_shm_op = lambda: None
from datastates.llm import DecoratedCheckpointing  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    out, max_steps = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    deepspeed_config = {
        "train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True,
    }  # fmt: skip
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=4, max_steps=max_steps, save_steps=3, report_to="none",
        deepspeed=deepspeed_config, use_cpu=True, logging_steps=1, disable_tqdm=True,
    )  # fmt: skip
    trainer = Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=Tokens())
    DecoratedCheckpointing(runtime_config={"host_cache_size": 1, "trainer": trainer}, rank=0)
    trainer.train(resume_from_checkpoint=os.getenv("CKPT_LAST_STEP") is not None)
    print("ENGINE", type(trainer.model_wrapped.checkpoint_engine).__name__, "STEP", trainer.state.global_step)


if __name__ == "__main__":
    main()
