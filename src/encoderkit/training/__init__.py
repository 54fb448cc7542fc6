"""Training: the Trainer (pre-training and fine-tuning) and the pre-training job."""
from .config import TrainingConfig
from .trainer import Trainer, TrainingError

__all__ = ["Trainer", "TrainingConfig", "TrainingError"]
