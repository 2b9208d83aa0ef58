"""metalforge.msl: the model of MSL text that the backends running it read (sim, cuda).

`parse(text)` (parse.py) reads preprocessed MSL into `Signature`s, one per host-visible kernel
(signature.py: the model both backends bind calls by), plus what the backends' text rewrites
need; tokens.py is its tokenizer, walker.py the structure walk, scalars.py the Metal types'
sizes, blanks.py the text edits both backends share, and callmodel.py torch.mps.compile_shader's
call model (casts, grid and threadgroup).  Nothing here compiles or runs: the simulator
(metalforge.sim) and the cuda backend (metalforge.cuda) import this package, never each other.
This package lives outside both so that cuda does not depend on the simulator, and outside
codegen/ because it reads any MSL text (user-written too), not what codegen writes.
"""
