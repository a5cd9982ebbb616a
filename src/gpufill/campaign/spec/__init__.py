"""The campaign file: its pydantic models section by section (spec and the `*_spec` modules), `file:line` errors
(spec_errors), size limits (spec_limits), grid checks (grid_checks), and users' `module:factory` models checked in a
child process (user_models). Imports nothing else of the campaign."""
