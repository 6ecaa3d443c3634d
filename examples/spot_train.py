# The documentation's Spot Training script ("2 - Concurrent Checkpointing"), adapted to run offline.
# Only the marked OFFLINE lines differ from the documentation: the model and WikiText-2 come from
# local stand-ins (examples/offline_assets.py), bf16 and DeepSpeed are off on this CPU machine, and
# a few sizes can be shrunk through SPOT_* environment variables for tests. The checkpoint part
# (config, DecoratedCheckpointing, CKPT_LAST_STEP, trainer.train) and output_dir="./results" are
# exactly as documented: checkpoints land in ./results/concurrent_checkpoint/ of the run's work
# directory, which survives a failover, and the platform resumes from the last one committed.
#
#   PYTHONPATH=$CHECKPOINT_VENDOR HF_DATASETS_OFFLINE="1" python examples/spot_train.py
#   PYTHONPATH=$CHECKPOINT_VENDOR accelerate launch --num_processes 2 examples/spot_train.py
#
# As a job's command in the console (default image): PYTHONPATH=$CHECKPOINT_VENDOR python /opt/examples/spot_train.py

import argparse
import os
import sys  # OFFLINE

from datasets import load_dataset
from datastates.llm import DecoratedCheckpointing
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer, TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # OFFLINE
import offline_assets  # OFFLINE


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher (Deepspeed, torchrun, etc.)")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()

    assets = offline_assets.prepare(os.getenv("SPOT_ASSETS_DIR", "./offline_assets"))  # OFFLINE
    model_path = assets["model"]  # OFFLINE: was the Llama-3.2-1B snapshot in the HF cache

    # Load tokenizer and model
    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)

    # Set pad token to EOS if not already defined
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    # Load WikiText-2 dataset
    print("Starting dataset initialization", flush=True)  # OFFLINE: the line the failover guide mentions
    dataset = load_dataset("text", data_files={"train": assets["train"], "validation": assets["validation"]})  # OFFLINE

    # Tokenization function
    def tokenize_function(examples):
        return tokenizer(
            examples["text"],
            truncation=True,
            max_length=int(os.getenv("SPOT_MAX_LENGTH", "128")),  # OFFLINE: 128 in the documentation
            padding="max_length",
        )

    # Tokenize the dataset
    tokenized_dataset = dataset.map(tokenize_function, batched=True, remove_columns=["text"])

    train_dataset = tokenized_dataset["train"]
    valid_dataset = tokenized_dataset["validation"]

    data_collator = DataCollatorForLanguageModeling(
        tokenizer=tokenizer,
        mlm=False,  # Causal LM (not masked LM)
    )

    script_directory = os.path.dirname(os.path.abspath(__file__))
    ds_config_path = os.path.join(script_directory, "ds_config.json")

    training_args = TrainingArguments(
        output_dir="./results",
        num_train_epochs=3,
        max_steps=int(os.getenv("SPOT_MAX_STEPS", "-1")),  # OFFLINE: -1 (epochs) unless a test shortens it
        per_device_train_batch_size=2,  # Adjust based on GPU memory
        gradient_accumulation_steps=4,  # Effective batch size = batch_size * gradient_accumulation_steps
        save_strategy="steps",
        save_steps=int(os.getenv("SPOT_SAVE_STEPS", "200")),  # OFFLINE: 200 in the documentation
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=100,
        bf16=False,  # OFFLINE: True in the documentation; this machine has no GPU
        # deepspeed=ds_config_path,  # OFFLINE: DeepSpeed is not installed here
        report_to="none",
        seed=42,
    )

    model = AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True, low_cpu_mem_usage=True, device_map=None)

    # Initialize Trainer
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=valid_dataset,  # Optional: validation set for evaluation
        processing_class=tokenizer,
        data_collator=data_collator,
    )

    # ADD configuration for Concurrent CHECKPOINT ENGINE
    config = {
        "host_cache_size": 50,
        "parser_threads": 1,
        "pin_host_cache": True,
        "trainer": trainer,
    }

    ckpt_engine = DecoratedCheckpointing(runtime_config=config, rank=args.local_rank)

    resume_from_checkpoint = False

    if os.getenv("CKPT_LAST_STEP") != None:
        resume_from_checkpoint = True

    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
