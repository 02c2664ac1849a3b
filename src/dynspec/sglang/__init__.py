"""What runs inside or drives SGLang: the runtime hook a patched server imports (hook, adaptive),
the patch series and its applier (patches/, patching), and the sglang.bench_serving driver.

hook and adaptive import only the standard library and dynspec.policy (a profile, when one is
asked for, loads dynspec.sim.profile lazily); the other modules may import more."""
