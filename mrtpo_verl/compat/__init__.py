"""The seam: every detail of a dependency that is not its public API, one module per dependency.

=======================  ===========================================================================
module                   what it wraps
=======================  ===========================================================================
``compat.verl``          verl 0.9.1's v1 trainer internals (the advantage step's body, ``trainer_mode``,
                         the role → worker-class mapping, π_old parking), the FSDP actor engine's
                         attributes, and its weight export
``compat.verl_registries`` the modules that hold verl's estimator and trainer registries (names only,
                         imports nothing: the plugin waits for them)
``compat.transfer_queue`` the TransferQueue batch verl's v1 trainers keep (row keys, tags, non-tensor
                         fields, the reward function's ``reward_extra_info``)
``compat.transformers``  the ``DynamicCache`` layout a shared prefix's key/value cache is kept in
``compat.torch_fsdp``    FSDP2 module handling (keeping a module unsharded, its wrapped module)
``compat.ray``           the Python class behind a ``ray.remote`` actor class
``compat.omegaconf``     a config node as written (interpolation or value) rather than resolved
=======================  ===========================================================================

Each function's docstring says in one line what it relies on and since which version.
``tests/test_compat_contract_on_cpu.py`` exercises every function here against the installed
libraries; a failure names the seam function to re-read when a dependency changes. The rest of
``mrtpo_verl`` uses these functions and the dependencies' public APIs only.
"""
