//! Plain driver calls beside cudabuf's (CUDA only): `cuMemAlloc` + `cuMemFree`, the
//! reference for an allocation without the caching allocator.

use cudabuf::Context;

use crate::AnyResult;

/// One `cuMemAlloc` + `cuMemFree` of `size` bytes in `ctx` (pushed around the pair).
#[cfg(feature = "cuda")]
pub(crate) fn alloc_free(ctx: &Context, size: usize) -> AnyResult<()> {
    use cudabuf::cuda::cudarc::driver::sys;
    let cu_ctx = ctx.handle() as sys::CUcontext;
    // SAFETY: `cu_ctx` is the handle of a live CUDA context, retained by `ctx` for this
    // whole call; it is popped below.
    let status = unsafe { sys::cuCtxPushCurrent_v2(cu_ctx) };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuCtxPushCurrent: {status:?}").into());
    }
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: a context is current; `ptr` is a valid out-pointer.
    let allocated = unsafe { sys::cuMemAlloc_v2(&mut ptr, size) };
    let freed = if allocated == sys::CUresult::CUDA_SUCCESS {
        // SAFETY: `ptr` was just allocated in this context and is freed once.
        unsafe { sys::cuMemFree_v2(ptr) }
    } else {
        allocated
    };
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    if freed != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuMemAlloc/cuMemFree of {size} bytes: {freed:?}").into());
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn alloc_free(_ctx: &Context, _size: usize) -> AnyResult<()> {
    Err("raw driver calls need the cuda feature".into())
}
