"""Python frames from the interpreter's own frame chain: where each CPython version keeps its
thread states and frames (layouts), what a code object is called (code_objects), and the spans
the frames above traced calls make (frame_spans). The walk itself is bpf/calls/pystack.bpf.h."""
