"""What a round optimises, on score tensors: the paper's losses (Eq. 1-5 and the ablations), the
GOAL gradient objectives and the optional label-prediction term."""
