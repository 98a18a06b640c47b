"""The two model families and a single way to build either from a config."""

from jaxtrain.models.gpt2 import GPT2, GPT2Config
from jaxtrain.models.llama3 import LLaMA3, LLaMA3Config
from jaxtrain.models import gpt2, llama3

FAMILIES = {
    'gpt2': (GPT2, GPT2Config, gpt2.VARIANTS),
    'llama3': (LLaMA3, LLaMA3Config, llama3.VARIANTS),
}
