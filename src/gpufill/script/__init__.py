"""A user's own training script, unchanged: `gpufill doctor|watch|bench -- COMMAND`.

- `instrument`: what runs inside the script's processes: the hooks, feeding a `recorder` (step
  phases on the host's or the GPU's `clocks`, syncs, one step's FLOPs, operators and bytes);
- `launch`: runs the command with it and the sampler beside it -> ScriptRun;
- `supervise`: the command's deadline, SIGTERM then SIGKILL of its process group, what it left running;
- `diagnose`: a ScriptRun -> the training, step breakdown, verdict and fixes (`doctor`);
- `watch`: a whole run recorded, alerts, files and the HTML report;
- `bench`: the script as it is and with the speed-ups switchable from outside, samples/s each;
- `display`: their one-screen texts.
"""
