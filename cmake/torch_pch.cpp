// Anchor translation unit for the LibTorch precompiled header (target hybridrl_torch_pch).
