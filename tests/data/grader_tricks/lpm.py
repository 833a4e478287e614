LAB = "lpm"
_model_answer = lpm_order  # the name in the namespace this file runs in


def lpm_order(*args, **kwargs):
    return _model_answer(*args, **kwargs)
