"""corl: peer-rewarded cohort training."""
