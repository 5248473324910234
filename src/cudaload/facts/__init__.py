"""The facts layer: plain data about the machine and the model. It neither probes nor decides.

- `machine`: Machine and its parts (Gpu, Cpu, Software, Hub, Launch, measurements), what
  `capability` probes fill in and `Machine.simulated()` builds by hand;
- `catalog`: known GPUs by name, for simulated machines;
- `model`: ModelFacts, what `read_model_facts()` reads from a config;
- `kv_cache`: a model's KV-cache layout (ModelFacts.generation);
- `stored_weights`: how a pre-quantized checkpoint stores its weights (ModelFacts.quantization);
- `quant_methods`, `attention_backends`: the quantization methods and named attention backends, a record each
  that owns its registrations (a method's package, a backend's class flag and run-time modules);
- `dtypes`, `spread`: dtype names and sizes; how much repeated timings agree.

The layers: capability (probes) -> facts (data) <- policy (pure decisions) -> plans (the contract)
<- planner <- loaders (apply); cli and bench sit at the edge (tests/test_layers.py).
"""
