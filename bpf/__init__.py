"""The BPF C sources, shipped in the wheel as package data (``otel_eacgm.bpf``).

BCC compiles them at run time, so an installed agent needs the files themselves: this package
is how it finds them, from a checkout and from site-packages alike.
"""

from pathlib import Path

#: The directory holding calls.bpf.c, net.bpf.c and the headers they include.
SOURCE_DIR = Path(__file__).resolve().parent
