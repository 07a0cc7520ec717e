"""Evolution strategies: fine-tune a distilled scenario policy on the true cost.

``ESConfig`` (config.py), ``es_finetune`` (algorithm.py), ``train_to_dir`` (command.py,
behind ``cloudrl scenarios es``)."""

from cloudrl.algorithms.es.algorithm import ESResult, es_finetune
from cloudrl.algorithms.es.config import ESConfig

__all__ = ["ESConfig", "ESResult", "es_finetune"]
