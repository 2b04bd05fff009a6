//! One reduction on the first CUDA device: links cubecl-cuda 0.11, cubecl-llvm and the LLVM
//! it needs, and on a GPU compiles and runs one kernel through LLVM's NVPTX backend.

use burn::tensor::{Device, Tensor};

fn main() {
    let device = Device::cuda(0);
    let ones = Tensor::<2>::ones([64, 64], &device);
    println!("sum of a 64 x 64 tensor of ones on CUDA: {}", ones.sum());
}
