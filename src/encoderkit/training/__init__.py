"""Training: the Trainer (pre-training and fine-tuning) and the pre-training job."""
from .trainer import Trainer, TrainingConfig, TrainingError

__all__ = ["Trainer", "TrainingConfig", "TrainingError"]
