"""The model classes a dynspec CPU server of SGLang 0.5.23 serves, for SGLANG_EXTERNAL_MODEL_PACKAGE.

Why: by default 0.5.23's ModelRegistry imports all of its ~250 model modules in every server
process at start (minutes when several servers share two cores); with this package as the
"external" one it registers these two and imports no others.  The classes are SGLang's own.
"""
