"""The facts layer: plain data about the machine and the model. It neither probes nor decides.

- `machine`: Machine and its parts (Gpu, Cpu, Software, Hub, Launch, measurements), what
  `capability` probes fill in and `Machine.simulated()` builds by hand;
- `catalog`: known GPUs by name, for simulated machines;
- `model`: ModelFacts, what `read_model_facts()` reads from a config.

The layers: capability (probes) -> facts (data) <- policy (pure decisions) -> plan (the contract)
<- loaders (apply); cli and bench sit at the edge.
"""
