"""ftjob's trainer: FSDP2 engine, guarded checkpointing, preemption handling and the job coordinator.

This package's top level must not import torch: the operator imports `ftjob_trainer.contract`.
"""
