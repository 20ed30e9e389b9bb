"""The simulated world: tagged arithmetic prompts, a hidden graded gold preference, a noisy
demonstrator, simulated Label Studio annotators and SFT of the tiny policy.

Submodules are imported explicitly (`rlhf_core.sim.world`, `.annotators`, `.sft`) so that the
cheap ones (world, annotators) never pull in torch.
"""
