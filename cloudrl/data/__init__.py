"""The shared data formats: one low layer every algorithm and pipeline reads.

* :mod:`cloudrl.data.episodes`: recorded episodes (RLlib's offline episode format);
* :mod:`cloudrl.data.segments`: episodes as arrays, segments and their statistics;
* :mod:`cloudrl.data.demonstrations`: demonstrated steps as flat arrays (behaviour cloning);
* :mod:`cloudrl.data.pairs`: preference pairs of segments (teacher and operator labels);
* :mod:`cloudrl.data.offline`: offline datasets (episodes with a per-step cost).

Readers, writers and validation only: what produces the data (recording policies, the
teacher, the offline recorder) lives in the pipelines above. Nothing here imports from
them. Submodules are imported on demand, so importing the package stays cheap.
"""
