"""The network and its weights: ResNet-18 as torchvision names it, where its weights come from, and BatchNorm
folded into its convolutions (issue 47: a room per role). Each module imports only those before it:

    pretrained    torchvision's trained checkpoint: downloaded once, checked, cached (standard library only)
    architecture  ResNet-18 with torchvision's module names, and its seeded default weights
    folding       BatchNorm folded into the convolutions, the custom engine's parameter file, the checkpoints
    onnx_import   the weights of a ResNet-18 ONNX file as a torchvision state dict
    weights       ResNet-18 with its weights from a checkpoint, an ONNX file or the seed

The engines (`fusedresnet.backend.engines`) run the folded network; nothing here imports them. This file imports
nothing, so `from fusedresnet.backend.resnet import pretrained` needs no torch (the client's demo reads its names).
"""
