"""The model repository's preparation: the files `prepare` writes beside each entry's config, and the copies the
project makes of a repository (issue 47: a room per role). Each module imports only those before it:

    prepared_stamp  the stamp `prepare` writes last, and how to read it (standard library only: the client's demo
                    reads it)
    copies          a model repository made from another: some entries, their configs changed, the rest linked
                    (the launcher's --instances gpu, perf_analyzer, the campaigns and the tests)
    prepare         the generated files of the repository: the weights of both networks, the labels, the stamp
                    (python -m fusedresnet.backend.repository.prepare; needs torch)

It stands on the network and its weights (`fusedresnet.backend.resnet`) and the wire contract. This file imports
nothing, so a client-only install reads the stamp without torch.
"""
