"""ort_flash's build-time package: the kernel sources (Triton and Gluon), the variant table and the
ahead-of-time build that compiles them into cubins and generates the C++ kernel table. It runs
where the library is built, with no GPU (`python -m aot.build`), and is never installed: the
product ships what it generates."""
