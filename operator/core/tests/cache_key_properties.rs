//! Property tests of the tenant-scoped cache identity.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use strata_core::cache_key::{CacheKey, CacheKeyInputs, MasterKey, compute_cache_key, derive_tenant_key};

const FIELDS: usize = 9;

fn field_mut(inputs: &mut CacheKeyInputs, index: usize) -> &mut String {
    match index {
        0 => &mut inputs.tenant,
        1 => &mut inputs.privacy_scope,
        2 => &mut inputs.provider,
        3 => &mut inputs.model,
        4 => &mut inputs.tokenizer,
        5 => &mut inputs.system_policy_hash,
        6 => &mut inputs.tool_contract_hash,
        7 => &mut inputs.stable_context_hash,
        _ => &mut inputs.canonicalization_version,
    }
}

fn inputs_strategy() -> impl Strategy<Value = CacheKeyInputs> {
    prop::collection::vec(".{0,12}", FIELDS).prop_map(|fields| {
        let mut inputs = CacheKeyInputs {
            tenant: String::new(),
            privacy_scope: String::new(),
            provider: String::new(),
            model: String::new(),
            tokenizer: String::new(),
            system_policy_hash: String::new(),
            tool_contract_hash: String::new(),
            stable_context_hash: String::new(),
            canonicalization_version: String::new(),
        };
        for (index, value) in fields.into_iter().enumerate() {
            *field_mut(&mut inputs, index) = value;
        }
        inputs.tenant = format!("t-{}", inputs.tenant);
        inputs
    })
}

fn master() -> MasterKey {
    MasterKey::new((0u8..32).collect()).unwrap()
}

fn key_for(master: &MasterKey, inputs: &CacheKeyInputs, epoch: u64) -> CacheKey {
    let tenant_key = derive_tenant_key(master, &inputs.tenant, epoch).unwrap();
    compute_cache_key(&tenant_key, inputs).unwrap()
}

proptest! {
    #[test]
    fn equal_inputs_give_identical_keys(inputs in inputs_strategy(), epoch in any::<u64>()) {
        let master = master();
        prop_assert_eq!(key_for(&master, &inputs, epoch), key_for(&master, &inputs.clone(), epoch));
    }

    #[test]
    fn every_component_matters(
        inputs in inputs_strategy(),
        index in 0..FIELDS,
        replacement in ".{0,12}",
    ) {
        let master = master();
        let mut changed = inputs.clone();
        let field = field_mut(&mut changed, index);
        if *field == replacement || index == 0 {
            field.push('x');
        } else {
            *field = replacement;
        }
        prop_assert_ne!(key_for(&master, &inputs, 1), key_for(&master, &changed, 1));
    }

    #[test]
    fn boundary_shifts_between_fields_change_the_key(
        inputs in inputs_strategy(),
        index in 1..FIELDS - 1,
    ) {
        let mut shifted = inputs.clone();
        let moved = field_mut(&mut shifted, index).pop();
        prop_assume!(moved.is_some());
        if let Some(character) = moved {
            field_mut(&mut shifted, index + 1).insert(0, character);
        }
        prop_assert_ne!(inputs.encode(), shifted.encode());
        let master = master();
        prop_assert_ne!(key_for(&master, &inputs, 1), key_for(&master, &shifted, 1));
    }

    #[test]
    fn same_text_in_two_tenants_gives_different_keys(
        inputs in inputs_strategy(),
        other_tenant in "[a-z]{1,8}",
    ) {
        prop_assume!(other_tenant != inputs.tenant);
        let master = master();
        let mut other = inputs.clone();
        other.tenant = other_tenant;
        prop_assert_ne!(key_for(&master, &inputs, 1), key_for(&master, &other, 1));
    }

    #[test]
    fn epoch_bump_and_master_rotation_change_the_key(inputs in inputs_strategy(), epoch in 0u64..u64::MAX) {
        let master = master();
        let original = key_for(&master, &inputs, epoch);
        prop_assert_ne!(&original, &key_for(&master, &inputs, epoch + 1));
        let rotated = MasterKey::new(vec![0xEE; 32]).unwrap();
        prop_assert_ne!(&original, &key_for(&rotated, &inputs, epoch));
        prop_assert_eq!(original.short().len(), 16);
        prop_assert!(original.as_hex().starts_with(original.short()));
    }
}
